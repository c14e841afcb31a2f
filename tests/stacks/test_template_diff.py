"""tests/stacks/template_diff.py's comparison: asset hashes normalised, everything else kept."""

from template_diff import differences, normalised

OLD, NEW = "a" * 64, "b" * 64  # an asset's hash before and after its code changed
OTHER_OLD, OTHER_NEW = "c" * 64, "d" * 64
RECIPE = "e" * 64  # a content hash that is no asset's: the image's recipe


def function(key: str, handler: str = "tick.handler") -> dict:
    return {"Type": "AWS::Lambda::Function",
            "Properties": {"Code": {"S3Key": f"{key}.zip"}, "Handler": handler}}  # fmt: skip


def template(*resources: dict, tag: str = RECIPE) -> dict:
    found = {f"F{i}": resource for i, resource in enumerate(resources)}
    return {"Resources": found, "Metadata": {"horovod-fleet:recipe-sha256": tag}}


def compare(before: dict, after: dict) -> list[str]:
    assets = {OLD, NEW, OTHER_OLD, OTHER_NEW}
    return differences(normalised(before, assets), normalised(after, assets))


def test_templates_whose_assets_changed_compare_equal():
    before = template(function(OLD), function(OTHER_OLD, "answers.on_event"))
    after = template(function(NEW), function(OTHER_NEW, "answers.on_event"))
    assert compare(before, after) == []


def test_a_changed_handler_is_the_one_difference():
    before, after = template(function(OLD)), template(function(NEW, "controller.tick.handler"))
    assert compare(before, after) == [
        '$.Resources.F0.Properties.Handler: "tick.handler" -> "controller.tick.handler"'
    ]


def test_a_function_moved_to_another_asset_differs():
    before = template(function(OLD), function(OTHER_OLD))
    after = template(function(NEW), function(NEW))
    assert compare(before, after) == [
        '$.Resources.F1.Properties.Code.S3Key: "<asset 2>.zip" -> "<asset 1>.zip"'
    ]


def test_a_hash_that_is_no_asset_s_stays_what_it_is():
    before, after = template(function(OLD)), template(function(NEW), tag="f" * 64)
    [line] = compare(before, after)
    assert line.startswith("$.Metadata.horovod-fleet:recipe-sha256:") and RECIPE in line


def test_resources_added_or_removed_are_named():
    before = template(function(OLD))
    after = template(function(NEW), function(OTHER_NEW))
    assert compare(before, after) == [
        '$.Resources.F1: added ({"Properties": {"Code": {"S3Key": "<asset 2>.zip"}, '
        '"Handler": "tick.handler"}, "Type": "AWS::Lambda::Function"})'
    ]
