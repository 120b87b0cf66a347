"""What a run and a calibration share: the experiment's shape, device provisioning, and the reports of a fault plan."""
from __future__ import annotations

from monsoon.load.shapes import build_shape
from monsoon.observe.progress import Progress
from monsoon.spec.experiment import ExperimentSpec
from monsoon.stack.provision import NoProvisioner, TbRestProvisioner, device_names
from monsoon.stack.supervisor import Stack



def experiment_shape(exp: ExperimentSpec, profile: str):
    """The experiment's load shape for ``profile`` (see ``ShapeSpec``: how each kind uses the profile's
    warmup / burst / recovery windows)."""
    return build_shape(exp.load.shape, exp.load.base_rate, exp.durations(profile), profile)


def provision(stack: Stack, exp: ExperimentSpec):
    prov = stack.spec.provisioning
    wanted = device_names(exp.load.device_prefix, exp.load.devices)
    client = NoProvisioner() if prov.kind == "none" else \
        TbRestProvisioner(stack.endpoint(prov.url), prov.username, prov.password)
    client.login()
    return client.ensure_devices(wanted)


def _report_plan(plan, label: str, progress: Progress) -> None:
    injected = [e for e in plan.events if e["phase"] == "inject"]
    landed = sum(1 for e in injected if e["landed"] is True)
    heals = [e for e in plan.events if e["phase"] == "heal"]
    healed = sum(1 for e in heals if e["landed"] is not False)
    progress(f"[{label}] faults: {len(injected)} injected, {landed} landed, {healed} of {len(heals)} heals verified"
             + ("" if not plan.leftovers else f"; LEFT IN PLACE: {plan.leftovers}")
             + ("" if not plan.errors else f"; errors: {'; '.join(plan.errors)}"))


def _totals_dict(totals) -> dict:
    d = dict(vars(totals))
    d.pop("last_seq", None)
    return d
