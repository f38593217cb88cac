"""The one-variable-at-a-time plan and the sweep configs (no processes)."""

import pytest
from hydra import compose, initialize_config_module

from memsweep.conf.contract import RunSpec, SpecError
from memsweep.sweeper.ovat import launch_order, plan_conditions
from memsweep.sweeper.spec import probe_device, spec_from_config

BASE = {"batch": 8, "context": 128, "width": 256, "dtype": "float32"}


def test_plan_is_a_union_with_the_baseline_once():
    plan = plan_conditions({"batch": [4, 8, 16], "context": [64, 128]}, BASE)
    assert plan == [("batch", "4"), ("", ""), ("batch", "16"), ("context", "64")]


def test_plan_rejects_unknown_axis_and_empty_list():
    with pytest.raises(SpecError, match="sweep.axes"):
        plan_conditions({"depth": [1, 2]}, BASE)
    with pytest.raises(SpecError, match="non-empty"):
        plan_conditions({"batch": []}, BASE)


def test_launch_order_is_largest_first_ties_in_the_given_order():
    specs = [
        RunSpec(batch=b, context=c, width=w)
        for b, c, w in [(1, 128, 256), (16, 128, 256), (8, 128, 256), (8, 256, 128), (1, 128, 4096), (4, 64, 256)]
    ]
    # activations: 32768, 524288, 262144, 262144 (tie: given order), 524288 (tie), 65536
    assert launch_order(specs) == [1, 4, 2, 3, 5, 0]
    assert launch_order(specs, "given") == [0, 1, 2, 3, 4, 5]
    with pytest.raises(SpecError, match="hydra.sweeper.order"):
        launch_order(specs, "random")


@pytest.mark.parametrize(
    "name, axes",
    [
        ("batch", {"batch"}),
        ("context", {"context"}),
        ("width", {"width"}),
        ("dtype", {"dtype"}),
        ("ovat", {"batch", "context", "width", "dtype"}),
    ],
)
def test_sweep_configs_change_one_variable_each(name, axes):
    with initialize_config_module(config_module="memsweep.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"sweep={name}"])
    assert set(cfg.sweep.axes) == axes
    for axis in axes:  # the baseline is one of the values swept
        assert cfg[axis] in list(cfg.sweep.axes[axis])
    plan = plan_conditions(dict(cfg.sweep.axes), {a: cfg[a] for a in BASE})
    assert len(plan) == sum(len(v) for v in cfg.sweep.axes.values()) - len(axes) + 1


def test_bfloat16_refused_where_the_device_lacks_it(monkeypatch):
    """The probe's answer for a GPU without native bf16 (cached the way the sweeper caches it)."""
    import json

    fake = {
        "requested": "cuda:0",
        "device": "cuda:0",
        "device_kind": "cuda",
        "available": True,
        "reason": None,
        "total_memory": 16 * 2**30,
        "device_name": "Tesla T4",
        "bf16_supported": False,
    }
    monkeypatch.setenv("MEMSWEEP_PROBE_cuda_0", json.dumps(fake))
    assert probe_device("cuda:0")["device_name"] == "Tesla T4"
    with initialize_config_module(config_module="memsweep.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["device=cuda:0", "dtype=bfloat16"])
        with pytest.raises(SpecError, match="invalid dtype='bfloat16'.*float32, float16"):
            spec_from_config(cfg)
        cfg = compose(config_name="config", overrides=["device=cuda:0", "capacity=17GiB"])
        with pytest.raises(SpecError, match="capacity.*total_memory"):
            spec_from_config(cfg)
        cfg = compose(
            config_name="config", overrides=["device=cuda:0", "dtype=float16", "capacity=8GiB", "snapshot_on_oom=true"]
        )
        spec = spec_from_config(cfg)
    assert spec.device == "cuda:0" and spec.capacity_bytes == 8 * 2**30 and spec.snapshot_on_oom


def test_submitit_local_launches_at_most_the_pool_size_at_once():
    from omegaconf import OmegaConf

    from memsweep.conf.contract import RunSpec
    from memsweep.sweeper.ovat import OvatSweeperImpl
    from memsweep.sweeper.pool import core_slots

    impl = OvatSweeperImpl()
    spec = RunSpec(batch=1, context=8, width=16, device="cpu")
    local = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher"
    for pool, cores_per_run in (("cores", 1), ("gpus", 1), ("none", 1)):
        impl.config = OmegaConf.create(
            {
                "pool": pool,
                "cores_per_run": cores_per_run,
                "isolation": "spawn",
                "hydra": {"launcher": {"_target_": local}},
            }
        )
        assert impl.local_bound([spec] * 29) == len(core_slots(1))  # one CPU run per usable core
    impl.config.hydra.launcher._target_ = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
    assert impl.local_bound([spec] * 29) is None  # joblib bounds itself (n_jobs)
