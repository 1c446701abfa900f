"""Stage tasks (GLDP's STHFL setting): the round schedule, stage-restricted client views,
evaluation on the seen stages, A_local / A_global / A_part, the CLI and the report."""

from __future__ import annotations

from types import SimpleNamespace

import json

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_raw
from fedtail.report.blocks import final_rounds_phrase, plotted_methods
from fedtail.algorithms.base import ClientHalf, Message
from fedtail.components import build_config
from fedtail.engine import prepare
from fedtail.engine.executors import Task
from fedtail.engine.context import load_weights
from fedtail.engine.executors import LOCAL_MODEL
from fedtail.engine.simulation import EVAL_CALL
from fedtail.engine.training import evaluate
from fedtail.errors import ConfigError
from fedtail.metrics import stage_metrics
from fedtail.metrics.stages import StageCounts
from helpers import (
    STAGE_SMOKE,
    assert_fails_in_one_line,
    assert_serial_and_parallel_agree,
    invoke,
    invoke_run,
    run,
    run_cli,
    runtime,
    staged,
    staged_raw,
)

# --- the schedule ------------------------------------------------------------------------------


def test_rounds_form_equal_consecutive_stage_blocks():
    config = staged()
    assert (config.plan.num_stages, config.plan.stage_rounds, config.plan.schedule) == (3, 2, "blocks")
    assert [config.plan.stage_of(r) for r in range(1, 7)] == [0, 0, 1, 1, 2, 2]
    assert [config.plan.seen_stages(r) for r in range(1, 7)] == [1, 1, 2, 2, 3, 3]
    assert [r for r in range(1, 7) if config.plan.is_stage_end(r)] == [2, 4, 6]
    assert [r for r in range(1, 7) if config.plan.evaluates(r)] == list(range(1, 7))
    assert [config.plan.global_round(r) for r in range(1, 7)] == list(range(1, 7))
    explicit = staged(rounds=9, rounds_per_stage=3)
    assert [explicit.plan.stage_of(r) for r in range(1, 10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [r for r in range(1, 10) if explicit.plan.has_later_stage(r)] == list(range(1, 7))
    plain = tiny_config()  # without stages: one stage, the whole run
    assert plain.plan.num_stages == 1 and {plain.plan.stage_of(r) for r in range(1, 4)} == {0}
    assert plain.plan.schedule is None and not plain.plan.has_stages


def test_nested_schedule_is_the_default_and_runs_the_stage_tasks_in_turn():
    config = staged(stage_schedule=None, rounds=9, eval_every=2)
    assert config.plan.schedule == "nested" and config.plan.stage_rounds == 1
    assert [config.plan.stage_of(r) for r in range(1, 10)] == [0, 1, 2] * 3
    assert [config.plan.global_round(r) for r in range(1, 10)] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    # the first round of global optimisation has seen 1, 2, 3 stages; every later one all of them
    assert [config.plan.seen_stages(r) for r in range(1, 10)] == [1, 2, 3, 3, 3, 3, 3, 3, 3]
    # evaluated at the end of every eval_every-th round of global optimisation, and at the last
    assert [r for r in range(1, 10) if config.plan.evaluates(r)] == [6, 9]
    assert [r for r in range(1, 10) if config.plan.has_later_stage(r)] == list(range(1, 9))
    # eval_final: every round of global optimisation among the final N too
    dense_tail = staged(stage_schedule=None, rounds=9, eval_every=2, eval_final=2)
    assert [r for r in range(1, 10) if dense_tail.plan.evaluates(r)] == [6, 9]
    dense_tail = staged(stage_schedule=None, rounds=15, eval_every=4, eval_final=2)  # 5 rounds of global optimisation
    assert [r for r in range(1, 16) if dense_tail.plan.evaluates(r)] == [12, 15]
    dense_tail = staged(stage_schedule=None, rounds=15, eval_every=2, eval_final=3)
    assert [r for r in range(1, 16) if dense_tail.plan.evaluates(r)] == [6, 9, 12, 15]
    rows, sim = run(config)
    assert [(r["round"], r["global_round"], r["stage"], r["seen_stages"]) for r in rows] == [(6, 2, 2, 3), (9, 3, 2, 3)]
    logs = [log for row in rows for log in row["rounds_log"]]
    assert [log["round"] for log in logs] == list(range(1, 10))
    # the clients of a round of global optimisation train all its stage tasks
    by_global = {}
    for log in logs:
        by_global.setdefault(config.plan.global_round(log["round"]), []).append(log["clients"])
    assert all(all(c == clients[0] for c in clients) for clients in by_global.values())
    assert len({tuple(c[0]) for c in by_global.values()}) > 1
    sizes = np.array([[len(st.train) for st in c.stages] for c in sim.partition.clients])
    for log in logs:
        assert log["samples"] == sizes[log["clients"], config.plan.stage_of(log["round"])].sum()


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (dict(rounds=7), "--rounds 7 must be a multiple of --stages 3"),
        (dict(rounds=6, rounds_per_stage=3), "--rounds-per-stage 3 × --stages 3 = 9 must equal --rounds 6"),
        (dict(rounds=6, rounds_per_stage=0), "--rounds-per-stage"),
        (dict(rounds=7, stage_schedule=None), "--rounds 7 must be a multiple of --stages 3: with --stage-schedule nested"),
        (dict(rounds=6, rounds_per_stage=2, stage_schedule="nested"),
         "--rounds-per-stage only applies to --stage-schedule blocks"),
        (dict(stage_schedule="rounds"), "--stage-schedule"),
    ],
)
def test_stage_schedule_errors(overrides, needle):
    with pytest.raises(ConfigError) as err:
        build_config(staged_raw(**overrides))
    assert needle in str(err.value)


def test_stage_options_need_the_stages_partition():
    with pytest.raises(ConfigError, match="--rounds-per-stage only applies to --partition stages"):
        build_config(tiny_raw(rounds_per_stage=1))
    with pytest.raises(ConfigError, match="--stage-schedule only applies to --partition stages"):
        build_config(tiny_raw(stage_schedule="blocks"))
    # and they are reachable with --set, as top-level keys
    assert build_config(staged_raw(), ["rounds_per_stage=2"]).rounds_per_stage == 2
    assert build_config(staged_raw(), ["stage_schedule=nested"]).plan.schedule == "nested"


def test_config_json_of_runs_without_stages_is_unchanged():
    for config in (tiny_config(), staged(stage_schedule=None)):
        dumped = config.model_dump(mode="json")
        assert "rounds_per_stage" not in dumped and "stage_schedule" not in dumped
    assert staged(rounds_per_stage=2).model_dump(mode="json")["rounds_per_stage"] == 2
    assert staged().model_dump(mode="json")["stage_schedule"] == "blocks"


# --- what a client sees --------------------------------------------------------------------------


class Recorder(ClientHalf):
    """Records what the context offers, and trains like FedAvg (from the run's initial model)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def fit(self, msg, ctx):
        ctx.load(ctx.init_weights)
        stats = ctx.train()
        self.calls.append(
            dict(
                stage=ctx.stage,
                train=ctx.data.train.clone(),
                eval_index=ctx.data.eval_index.clone(),
                stage_classes=ctx.data.stage_classes,
                seen_classes=ctx.data.seen_classes,
                old_classes=ctx.data.old_classes,
                samples=stats.samples,
            )
        )
        return ctx.reply()


def test_a_client_trains_on_its_current_stage_only_and_sees_its_stage_classes():
    config = staged()
    rt = runtime(config)
    rt.client = Recorder()
    _, partition = prepare(config)
    train_y = rt.workspace.dataset.train.y
    for cid in (0, 3):
        stages = partition.clients[cid].stages
        for rnd, m in ((1, 0), (2, 0), (3, 1), (6, 2)):
            rt.run(Task(cid, rnd, 0, Message("fit"), {}))
            call = rt.client.calls[-1]
            assert call["stage"] == m
            # training data: exactly stage m's samples, and ctx.train() goes over them (1 epoch)
            assert torch.equal(call["train"], torch.as_tensor(stages[m].train))
            assert call["samples"] == len(stages[m].train)
            assert set(train_y[call["train"]].tolist()) <= set(stages[m].classes.tolist())
            # the classes: current stage, all seen stages, the earlier ones
            assert call["stage_classes"].tolist() == sorted(stages[m].classes.tolist())
            seen = sorted({c for s in stages[: m + 1] for c in s.classes.tolist()})  # each class once
            assert call["seen_classes"].tolist() == seen
            assert call["old_classes"].tolist() == sorted({c for s in stages[:m] for c in s.classes.tolist()})
            # evaluation data: the test samples of the stages 0..m, exactly
            expected = np.sort(np.concatenate([s.test for s in stages[: m + 1]]))
            assert np.array_equal(call["eval_index"].numpy(), expected)


def test_nested_rounds_see_every_stage_after_the_first_round_of_global_optimisation():
    config = staged(stage_schedule=None)
    rt = runtime(config)
    rt.client = Recorder()
    _, partition = prepare(config)
    for cid in (1, 4):
        stages = partition.clients[cid].stages
        for rnd, m, seen in ((2, 1, 2), (4, 0, 3), (5, 1, 3)):
            rt.run(Task(cid, rnd, 0, Message("fit"), {}))
            call = rt.client.calls[-1]
            assert call["stage"] == m and torch.equal(call["train"], torch.as_tensor(stages[m].train))
            assert call["stage_classes"].tolist() == stages[m].classes.tolist()
            held = sorted({int(c) for s in stages[:seen] for c in s.classes})
            assert call["seen_classes"].tolist() == held  # each class once, though classes recur
            others = sorted({int(c) for k, s in enumerate(stages[:seen]) if k != m for c in s.classes})
            assert call["old_classes"].tolist() == others
            expected = np.sort(np.concatenate([s.test for s in stages[:seen]]))
            assert np.array_equal(call["eval_index"].numpy(), expected)


def test_evaluation_groups_name_the_stage_of_every_test_sample():
    config = staged(stage_schedule=None)
    rt = runtime(config)
    _, partition = prepare(config)
    recurring = 0
    for cid, view in enumerate(rt.views.at(6)):
        stages = partition.clients[cid].stages
        for k, st in enumerate(stages):
            assert sorted(view.eval_index[view.eval_groups == k].tolist()) == sorted(st.test.tolist())
        recurring += len(set().union(*[set(s.classes.tolist()) for s in stages])) < 6
        reply = rt.run(Task(cid, 6, EVAL_CALL, Message("evaluate", rt.workspace.init_weights), {}, read_only=True)).reply
        by_stage = reply.tensors["stage_total"]
        assert by_stage.shape == (3, 6) and torch.equal(by_stage.sum(0), reply.tensors["total"])
        test_y = rt.workspace.dataset.test.y.numpy()
        assert by_stage.tolist() == [np.bincount(test_y[s.test], minlength=6).tolist() for s in stages]
        assert reply.tensors["stage_correct"].sum(0).tolist() == reply.tensors["correct"].tolist()
    assert recurring  # some client holds fewer classes than its 3 × 2 class slots: a class came back


def test_evaluation_counts_exactly_the_seen_stages_test_samples():
    config = staged()
    rt = runtime(config)
    _, partition = prepare(config)
    test_y = rt.workspace.dataset.test.y.numpy()
    for cid in range(6):
        stages = partition.clients[cid].stages
        for rnd, m in ((2, 0), (3, 1), (5, 2)):
            msg = Message("evaluate", rt.workspace.init_weights)
            reply = rt.run(Task(cid, rnd, EVAL_CALL, msg, {}, read_only=True)).reply
            seen = np.concatenate([s.test for s in stages[: m + 1]])
            assert reply.tensors["total"].tolist() == np.bincount(test_y[seen], minlength=6).tolist()
            # every seen class is tested (the local-test rule is applied per stage)
            assert set(np.flatnonzero(reply.tensors["total"].numpy())) == {
                int(c) for s in stages[: m + 1] for c in s.classes
            }


@pytest.mark.parametrize(
    "overrides, kind",
    [
        (dict(partition={"local_test": "holdout"}), "test"),
        (dict(partition={"val_fraction": 0.2}, eval_split="val"), "val"),
    ],
    ids=["holdout", "val"],
)
def test_holdout_and_validation_views_follow_the_stages(overrides, kind):
    config = staged(**overrides)
    rt = runtime(config)
    _, partition = prepare(config)
    for m, rnd in enumerate((1, 3, 5)):
        for cid, view in enumerate(rt.views.at(rnd)):
            stages = partition.clients[cid].stages
            expected = np.sort(np.concatenate([getattr(s, kind) for s in stages[: m + 1]]))
            assert np.array_equal(view.eval_index.numpy(), expected)
            assert view.eval_split is rt.workspace.dataset.train  # both index the training split
            assert np.array_equal(view.train.numpy(), stages[m].train)
    rows, _ = run(config.model_copy(update={"eval_every": 3}))
    assert [r["stage"] for r in rows] == [0, 1, 1, 2]


def test_rounds_train_the_stage_sizes_and_the_server_knows_the_stage():
    config = staged()
    rows, sim = run(config)
    sizes = np.array([[len(s.train) for s in c.stages] for c in sim.partition.clients])  # clients × stages
    logs = [log for row in rows for log in row["rounds_log"]]
    for log in logs:
        m = config.plan.stage_of(log["round"])
        assert log["samples"] == sizes[log["clients"], m].sum()  # FedAvg: one epoch each
    assert sim.server_ctx.stage == 2
    assert sim.server_ctx.client_train_sizes.tolist() == sizes[:, 2].tolist()
    assert sim.server_ctx.stage_of(3) == 1


# --- metrics -------------------------------------------------------------------------------------


def counts(correct, total, by_correct, by_total) -> StageCounts:
    return StageCounts(*(np.array(x) for x in (correct, total, by_correct, by_total)))


def test_stage_metrics_on_a_hand_checked_case():
    # 4 clients, 3 classes, seen stages 0 and 1; client 0 has class 0 in both stages; client 3 has no data
    by_total = [[[4, 0, 0], [2, 2, 0]], [[0, 0, 2], [0, 2, 0]], [[3, 1, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]]
    by_correct = [[[3, 0, 0], [0, 1, 0]], [[0, 0, 2], [0, 0, 0]], [[0, 1, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]]
    sums = [np.array(x).sum(1) for x in (by_correct, by_total)]
    local = counts(*sums, by_correct, by_total)
    g_by = [[[4, 0, 0], [1, 2, 0]], [[0, 0, 1], [0, 1, 0]], [[3, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]]
    glob = counts(np.array(g_by).sum(1), sums[1], g_by, by_total)
    out = stage_metrics(local, [0, 2], glob)
    assert out["a_local"] == pytest.approx((4 / 8 + 2 / 4 + 1 / 4) / 3)
    assert out["a_part"] == pytest.approx((4 / 8 + 1 / 4) / 2)
    assert out["a_local_by_stage"] == pytest.approx([(3 / 4 + 1 + 1 / 4) / 3, (1 / 4 + 0) / 2])
    assert out["a_global"] == pytest.approx(12 / 16)
    assert out["a_global_by_stage"] == pytest.approx([8 / 10, 4 / 6])
    alone = stage_metrics(local, [3])  # no global model; a participant without data
    assert alone["a_part"] is None and alone["a_global"] is None and alone["a_global_by_stage"] is None


def test_rows_carry_the_stage_and_the_paper_metrics():
    config = staged(eval_every=3, algorithm="fedrep")
    rows, sim = run(config)
    # evaluated every 3 rounds and at the end of every stage
    assert [(r["round"], r["stage"], r["seen_stages"]) for r in rows] == [(2, 0, 1), (3, 1, 2), (4, 1, 2), (6, 2, 3)]
    for row in rows:
        participants = row["rounds_log"][-1]["clients"]
        assert row["a_local"] == row["personalized_acc"]  # a personalised method: its own model
        assert row["a_part"] == pytest.approx(np.mean([row["per_client_acc"][c] for c in participants]))
        assert row["a_global"] is None
        assert len(row["a_local_by_stage"]) == row["seen_stages"]
    summary = sim.record.summary(sim.meter, 1.0, config.rounds)
    assert summary["final"]["stage"] == 2 and summary["final"]["a_local"] == rows[-1]["a_local"]
    assert summary["final"]["seen_stages"] == 3 and summary["best"]["round"] == 6  # the only row of 3 stages


def test_a_local_of_a_method_without_personal_models_is_its_clients_latest_local_model():
    # FedAvg: the personalised accuracy is the global model's; A_local the clients' own trained models
    config = staged(stage_schedule=None)
    rows, sim = run(config)
    rt = runtime(config)
    row = rows[-1]
    views = rt.views.at(config.rounds)
    accs = []
    for cid in range(6):
        state = sim.client_state.get(cid, {})
        weights = state.get(LOCAL_MODEL, sim.server.global_weights())
        model = rt.workspace.model("check")
        load_weights(model, weights)
        got = evaluate(model, rt.workspace.dataset, views[cid].eval_split, views[cid].eval_index, 6)
        accs.append(got.accuracy)
    trained = [c for c in range(6) if LOCAL_MODEL in sim.client_state.get(c, {})]
    assert 0 < len(trained) < 6  # some clients never trained: the global model stands in
    assert row["a_local"] == pytest.approx(np.mean(accs))
    assert row["a_local"] != pytest.approx(row["personalized_acc"])
    # the global model everywhere: pooled A_global = the sample-weighted personalised accuracy
    assert row["a_global"] == pytest.approx(row["personalized_acc_weighted"])
    participants = row["rounds_log"][-1]["clients"]
    assert row["a_part"] == pytest.approx(np.mean([accs[c] for c in participants]))
    # the kept models are the clients' uploads: the last fit of client c
    c = participants[0]
    assert set(sim.client_state[c][LOCAL_MODEL]) == set(sim.server.global_weights())


def test_stage_runs_with_one_stage_have_the_paper_metrics():
    config = staged(stage_schedule=None, rounds=2, partition={"stages": 1, "num_clients": 4})
    rows, sim = run(config)
    assert [(r["round"], r["stage"], r["seen_stages"]) for r in rows] == [(1, 0, 1), (2, 0, 1)]
    assert all(r["a_local"] is not None and r["a_global"] is not None for r in rows)
    for cid, view in enumerate(runtime(config).views.at(1)):
        assert np.array_equal(view.train.numpy(), sim.partition.clients[cid].train)
        assert view.seen_classes.tolist() == sim.partition.clients[cid].stages[0].classes.tolist()


def test_runs_without_stages_have_no_stage_keys_and_whole_client_views():
    config = tiny_config(eval_every=2)
    rows, sim = run(config)
    assert not {"stage", "a_local", "a_global", "a_part", "a_local_by_stage", "named"} & set().union(*rows)
    summary = sim.record.summary(sim.meter, 1.0, config.rounds)
    assert "a_local" not in summary["final"] and "stage" not in summary["best"]
    rt = runtime(config)
    assert rt.views.at(1) is rt.views.at(3)
    for cid, client in enumerate(sim.partition.clients):
        view = rt.views.at(1)[cid]
        assert np.array_equal(view.train.numpy(), client.train) and np.array_equal(view.test.numpy(), client.test)
        assert view.stage == 0 and view.stage_classes is None and view.seen_classes is None
        assert view.eval_groups is None


def test_methods_without_a_global_model_have_no_global_accuracy():
    rows, sim = run(staged(algorithm="local", eval_every=2))
    assert all(r["a_global"] is None and r["a_global_by_stage"] is None for r in rows)
    assert all(LOCAL_MODEL not in s for s in sim.client_state.values())  # a personal model: nothing kept
    assert all(r["a_local"] == r["personalized_acc"] for r in rows)


def test_serial_and_parallel_agree_with_stages():
    assert_serial_and_parallel_agree(staged(algorithm="fedrep", rounds=3, partition={"stages": 3}, eval_every=2))


# --- the command line and the report -------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["fedavg", "local", "fedrep"])
def test_cli_run_with_stages(tmp_path, algorithm):
    done = run_cli(tmp_path, algorithm, smoke=STAGE_SMOKE)
    assert [(r["round"], r["stage"]) for r in done.rows] == [(1, 0), (2, 0), (3, 1), (4, 1)]
    final = done.final
    assert final["stage"] == 1
    # FedAvg's A_local: its clients' own models, not the global one its personalised accuracy uses
    assert (final["a_local"] == final["personalized_acc"]) == (algorithm != "fedavg")
    assert (final["a_global"] is None) == (algorithm != "fedavg")
    assert 0 <= final["a_part"] <= 1


def test_cli_stage_errors_are_one_line(tmp_path):
    res = invoke_run(tmp_path / "a", "fedavg", smoke=STAGE_SMOKE, flags=["--rounds", "5", "--rounds-per-stage", "2"])
    assert_fails_in_one_line(res, "--rounds-per-stage 2 × --stages 2 = 4 must equal --rounds 5")
    res = invoke_run(tmp_path / "b", "fedavg", flags=["--rounds-per-stage", "2"])
    assert_fails_in_one_line(res, "--rounds-per-stage only applies to --partition stages")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_partition_command_ignores_the_round_schedule(tmp_path):
    res = invoke("partition", "--dataset", "synthetic", "--partition", "stages", "--stages", "3",
                 "--classes-per-stage", "1", "--clients", "4", "--out", tmp_path / "p.json")  # fmt: skip
    assert res.exit_code == 0, res.output


def test_partition_command_draws_the_paper_settings(tmp_path):
    # [20, 4, 5] on 10 classes: 400 class slots, rejected while classes could not recur
    res = invoke("partition", "--dataset", "synthetic", "--partition", "stages", "--stages", "5",
                 "--classes-per-stage", "4", "--clients", "20", "--imbalance", "10", "--balanced",
                 "--set", "dataset_options.train_per_class=300", "--out", tmp_path / "p.json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "5 stage tasks per client" in res.output and "bring back a class of an earlier one" in res.output
    data = json.loads((tmp_path / "p.json").read_text())
    assert len(data["clients"]) == 20 and all(len(c["stages"]) == 5 for c in data["clients"])
    sizes = [sum(c["train_counts"]) for c in data["clients"]]
    assert max(sizes) - min(sizes) <= 20
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_report_shows_the_stage_metrics(tmp_path):
    for algorithm in ("fedavg", "local"):
        res = invoke_run(tmp_path / "runs" / algorithm, algorithm, smoke=STAGE_SMOKE)
        assert res.exit_code == 0, res.output
        assert "A_local" in res.output
    md = tmp_path / "R.md"
    res = invoke("report", tmp_path / "runs", "--out", md)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert "## Final-round stage-task accuracies (%)" in text
    setting = "synthetic-stages2x2-if1"
    assert f"| method | {setting} A_local | {setting} A_global | {setting} A_part |" in text
    local_row = next(line for line in text.splitlines() if line.startswith("| local |") and "—" in line)
    assert local_row.count("(1 seed)") == 2  # A_local and A_part; no A_global


def test_report_has_a_row_per_named_accuracy_the_last10_tables_and_the_participants_figure(tmp_path):
    for algorithm in ("gldp", "fedavg"):
        res = invoke_run(tmp_path / "runs" / algorithm, algorithm, smoke=STAGE_SMOKE)
        assert res.exit_code == 0, res.output
    assert "gp: final" in invoke_run(tmp_path / "cli", "gldp", smoke=STAGE_SMOKE).output  # fedtail run prints them
    md = tmp_path / "R.md"
    res = invoke("report", tmp_path / "runs", "--out", md)
    assert res.exit_code == 0, res.output
    text = md.read_text()
    assert "## Personalised accuracy, mean over the final 10 rounds (%)" in text
    assert "## Stage-task accuracies, mean over the final 10 rounds (%)" in text
    summary = json.loads((tmp_path / "runs" / "gldp" / "summary.json").read_text())
    tables = text.split("## Costs")[0]
    for name in ("gp", "lp", "head"):
        lines = [line for line in tables.splitlines() if line.startswith(f"| gldp:{name} |")]
        assert len(lines) == 5  # final, best, last10, and the two stage tables
        final = summary["named"][name]["final"]["personalized_acc"]
        assert f"{100 * final:.2f} (1 seed)" in lines[0]
    methods = [line.split("|")[1].strip() for line in tables.splitlines() if line.startswith("| ")]
    assert methods[2:7] == ["fedavg", "gldp", "gldp:gp", "gldp:lp", "gldp:head"]  # after the header and ---
    costs = text.split("## Costs")[1]
    assert "gldp:gp" not in costs and "| gldp |" in costs  # a view of the gldp run: costed once
    assert (tmp_path / "R-participants.png").is_file()
    assert "- Runs: 2 finished, 0 unfinished" in text  # the named rows are views of the gldp run
    # stage tasks in blocks of rounds: the final 10 rounds are communication rounds
    assert "in the final 10 rounds (`summary.json`" in text and "of global optimisation" not in text


def test_the_final_10_rounds_are_rounds_of_global_optimisation_only_for_nested_stage_runs():
    def col(*configs):
        return SimpleNamespace(runs=[SimpleNamespace(finished=True, named=None, config=c) for c in configs])

    nested = {"partition": {"scheme": "stages", "stages": 5}}  # stage_schedule unset: nested
    one_stage = {"partition": {"scheme": "stages", "stages": 1}}
    blocks = {"partition": {"scheme": "stages", "stages": 5}, "stage_schedule": "blocks"}
    plain = {"partition": {"scheme": "dirichlet"}}
    assert final_rounds_phrase(col(nested, nested)).endswith("of global optimisation (each running the stage tasks in turn)")
    for configs in ((one_stage,), (blocks,), (plain, plain)):
        assert final_rounds_phrase(col(*configs)) == "the final 10 rounds"
    assert "for the runs with nested stage tasks" in final_rounds_phrase(col(nested, plain))


def test_figures_draw_a_methods_named_accuracies_instead_of_its_headline():
    col = SimpleNamespace(methods=["fedavg", "gldp", "gldp:gp", "gldp:lp", "apfl"])
    assert plotted_methods(col) == ["fedavg", "gldp:gp", "gldp:lp", "apfl"]
    assert plotted_methods(SimpleNamespace(methods=["fedavg", "gldp"])) == ["fedavg", "gldp"]  # none named
