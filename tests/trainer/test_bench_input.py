"""trainer.bench_input on user mistakes: one `error:` line, exit 2, never a hang or a 0 img/s."""

import pytest

from trainer import bench_input


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seconds", "nan"], "--seconds must be a finite number > 0, got nan"),
        (["--seconds", "inf"], "--seconds must be a finite number > 0, got inf"),
        (["--seconds", "0"], "--seconds must be a finite number > 0, got 0.0"),
        (["--warmup", "inf"], "--warmup must be a finite number >= 0, got inf"),
        (["--warmup", "nan"], "--warmup must be a finite number >= 0, got nan"),
        (["--batch-size", "0"], "--batch-size must be > 0, got 0"),
    ],
)
def test_bad_number_is_one_error_line_and_exit_2(tmp_path, capsys, flags, message):
    # A missing directory: the flag must be rejected before the data is even looked at.
    with pytest.raises(SystemExit) as exit_:
        bench_input.main(["--data-dir", str(tmp_path / "nowhere"), *flags])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_empty_data_dir_is_not_the_working_directory(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_input.main(["--data-dir", ""])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: --data-dir is empty; give a directory path\n"


def test_shards_without_records_fail_fast_instead_of_hanging(tmp_path, capsys):
    for index in range(2):
        (tmp_path / f"train-{index:05d}-of-00002").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_:
        bench_input.main(["--data-dir", str(tmp_path), "--seconds", "1", "--warmup", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"error: the train-* shards in {tmp_path} hold no records (every file is empty)\n"
    )
