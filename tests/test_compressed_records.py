"""Run records stored compressed (metrics.jsonl.gz, partition.json.gz): written by `fedtail sweep
--compress` and `fedtail runs --compress`, read by every reader as the plain files."""

from __future__ import annotations

import gzip
import json
import shutil
import time

from fedtail.api import load_run
from fedtail.report.collect import Run
from fedtail.report.runfiles import compress_records, read_record
from fedtail.sweep import load_sweep, run_status
from fedtail.sweep.estimate import rounds_done
from fedtail.tables import load_runs
from helpers import invoke, run_cli, sweep_base


def test_compressed_folder_reads_as_the_plain_one(tmp_path):
    result = run_cli(tmp_path, "fedavg")
    plain = load_run(result.out)
    metrics = (result.out / "metrics.jsonl").read_text()
    before = Run(result.out, "s", "m", 0, None, None)
    rows_before, counts_before, done_before = before.metrics(), before.class_counts(), rounds_done(result.out)
    packed = compress_records(result.out)
    assert sorted(p.name for p in packed) == ["metrics.jsonl.gz", "partition.json.gz"]
    assert not (result.out / "metrics.jsonl").exists() and not (result.out / "partition.json").exists()
    assert gzip.decompress((result.out / "metrics.jsonl.gz").read_bytes()).decode() == metrics
    assert read_record(result.out, "metrics.jsonl") == metrics
    again = load_run(result.out)
    assert again.rows == plain.rows and again.partition == plain.partition
    after = Run(result.out, "s", "m", 0, None, None)
    assert after.metrics() == rows_before and (after.class_counts() == counts_before).all()
    assert rounds_done(result.out) == done_before > 0
    assert len(load_runs(tmp_path)) == 1
    assert compress_records(result.out) == []  # a second call does nothing
    # the same content gives the same bytes (no timestamp or name in the gzip header)
    twin = tmp_path / "twin"
    shutil.copytree(result.out, twin)
    (twin / "metrics.jsonl").write_text(metrics)
    (twin / "metrics.jsonl.gz").unlink()
    time.sleep(1.1)  # a gzip header with a timestamp would now differ
    assert compress_records(twin) == [twin / "metrics.jsonl.gz"]
    assert (twin / "metrics.jsonl.gz").read_bytes() == (result.out / "metrics.jsonl.gz").read_bytes()


def test_an_unfinished_run_is_left_alone(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"round": 1}\n')
    assert compress_records(folder) == []
    assert (folder / "metrics.jsonl").exists()


def test_sweep_compress_writes_finished_runs_compressed_and_they_stay_done(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(f'out = "{(tmp_path / "runs").as_posix()}"\nseeds = [0]\n' + sweep_base(1) + "[methods.fedavg]\n")
    res = invoke("sweep", str(path), "--compress")
    assert res.exit_code == 0, res.output
    (run,) = load_sweep(path).runs
    assert (run.dir / "metrics.jsonl.gz").is_file() and not (run.dir / "metrics.jsonl").exists()
    assert run_status(run, set()).state == "done"
    res = invoke("sweep", str(path), "--dry-run")
    assert "1 done" in res.output
    record = json.loads((tmp_path / "runs" / "sweep.json").read_text())
    assert "--compress" in json.dumps(record)  # the command that made the runs says so


def test_runs_command_compresses_every_finished_run(tmp_path):
    result = run_cli(tmp_path, "fedavg")
    res = invoke("runs", str(tmp_path), "--compress")
    assert res.exit_code == 0, res.output
    assert "compressed 2 record(s)" in res.output
    assert (result.out / "metrics.jsonl.gz").is_file()
