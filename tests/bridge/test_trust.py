"""Evidence on a shared bus is signed or refused; hardware labels mean hardware; requirements pin parameters.

Real buses (`git daemon`), real SSH keys (`ssh-keygen`), real runners, attacked as someone with push access
to the bus would: unsigned and edited results, newer results that try to mask a signed pass, an `h200`
runner on a host without CUDA, evidence run with the cheapest parameters."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

import gates
from bridge import evidence as E
from bridge import host
from bridge.bus.bus import Bus
from bridge.bus.records import MANIFEST_PATH, new_id, req_ref, results_path
from bridge.bus.trust import ALLOWED_SIGNERS, principal
from bridge.cli.main import main
from bridge.config import load_config
from bridge.core.errors import InvalidRequest, KakeyaError
from bridge.presets.preset import Preset
from bridge.presets.registry import load_registry
from bridge.run.runner import Runner
from tests.bridge.bus_support import WRITE_REPORT_PY, Daemon, Env, git, make_runner, manifest_dict
from tests.bridge.test_gate_pr import LocalBus, gate, missing, outcomes
from tests.bridge.test_signing import allow, keygen, signed_runner

CUDA_HERE = host.hardware_for(["h200"], force=True) == []  # this host has CUDA: the refusals cannot be shown


@pytest.fixture(name="keys")
def keys_fixture(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "keys").mkdir()
    return {n: keygen(tmp_path / "keys" / n) for n in ("r1", "mallory")}


def trusted_base(env: Env, *signers: tuple[str, Path]) -> None:
    """The project (the trusted base gate pr runs in) names these runners in its allowed-signers file."""
    allow(env.project / ALLOWED_SIGNERS, *signers)
    git(env.project, "add", "-A")
    git(env.project, "commit", "-qm", "allowed signers")


# --- signed or refused -------------------------------------------------------------------------------------


def test_a_shared_bus_without_allowed_signers_is_refused_with_the_steps(
    world: Env, daemon: Daemon, capsys, tmp_path: Path
):
    bus = LocalBus(world, url=daemon.repo())
    head = git(world.project, "rev-parse", "HEAD")
    rid = bus.run("work")
    summary = tmp_path / "summary.md"
    assert gate(bus, head, "work@cpu", summary=summary, allow_unsigned=False) == 2
    err = capsys.readouterr().err
    assert f"no allowed-signers file ({world.project / ALLOWED_SIGNERS})" in err
    assert f"evidence on the shared bus {bus.url} must be signed" in err
    for step in (  # how to make the key, the line to add, where to set signing_key
        "ssh-keygen -t ed25519 -N '' -f ~/.config/kakeya/signing-key",
        'signing_key = "~/.config/kakeya/signing-key"',
        f"add its line to {ALLOWED_SIGNERS} on the trusted base branch",
        'RUNNER@LABEL[+LABEL...] namespaces="git" ssh-ed25519 AAAA...',
        "--allow-unsigned",
    ):
        assert step in err, step
    assert "✗ refused" in summary.read_text() and "ssh-keygen -t ed25519" in summary.read_text()
    # results --verify is refused the same way
    out = tmp_path / "res"
    assert main(["results", rid, "--verify", "--remote", bus.url, "--out", str(out)]) == 2
    assert "no allowed-signers file" in capsys.readouterr().err and not out.exists()

    # explicitly allowed: it passes, and says so on every row
    assert gate(bus, head, "work@cpu", summary=summary) == 0
    assert (
        capsys.readouterr().out
        == f"✓ work@cpu: pass — {rid} · unsigned (allowed) · accelerator: none · params: mode=count seconds=0.0 tag=x\n"
    )
    assert f"| ✓ | `work@cpu` | pass | `{rid}` | unsigned (allowed) |" in summary.read_text()
    argv = ["results", rid, "--verify", "--allow-unsigned", "--remote", bus.url, "--out", str(out)]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"{rid}: unsigned (allowed)\n")
    html = (out / rid / "report.html").read_text()
    assert (
        "<td>signed</td><td>unsigned (allowed only on the embedded bus, or with --allow-unsigned)</td>"
        in html
    )


def test_the_embedded_bus_needs_no_keys(world: Env, capsys):
    head = git(world.project, "rev-parse", "HEAD")
    assert main(["run", "work"]) == 0  # the embedded bus: .kakeya/bus.git, served in-process
    capsys.readouterr()
    assert main(["gate", "pr", "--subject", head, "--require", "work@cpu"]) == 0
    out = capsys.readouterr()
    assert "(embedded)" in out.err and "· unsigned (allowed) · accelerator: none" in out.out


def test_a_failing_signed_run_plus_a_commit_editing_its_report_is_refused(
    world: Env, daemon: Daemon, keys: dict[str, Path], capsys
):
    bus = LocalBus(world, url=daemon.repo())
    bus.runner = signed_runner(world, bus.url, "r1", ("cpu",), keys["r1"])
    head = git(world.project, "rev-parse", "HEAD")
    rid = bus.run("strict")  # signed, and fails: cpu_count 1 < 4096
    signed_done = bus.done(rid)
    report = json.loads(bus.files(rid)["report.json"])
    forged = {**report, "probe": {**report["probe"], "cpu_count": 8192}}
    bus.push_done(rid, signed_done, {f"{results_path(rid)}/report.json": json.dumps(forged).encode()}, True)
    # With no allowed-signers file, the bus is refused outright (only --allow-unsigned would take the edit) ...
    assert gate(bus, head, "strict@cpu", allow_unsigned=False) == 2
    assert "no allowed-signers file" in capsys.readouterr().err
    assert gate(bus, head, "strict@cpu") == 0  # ... which is why it is refused: the edit passes unsigned
    capsys.readouterr()
    # ... with the runner's key in the trusted base, the edit is no evidence: nothing passes
    trusted_base(world, (principal("r1", ["cpu"]), keys["r1"]))
    assert missing(capsys, bus, head, "strict@cpu") == [
        (
            rid,
            "untrusted",
            f"edited after the run: the done ref is {bus.done(rid)[:12]}, not runner r1@cpu's signed "
            f"commit {signed_done[:12]} (commits were added or rewritten after it)",
        )
    ]


def test_newer_unsigned_expired_or_cancelled_results_never_mask_a_signed_pass(
    world: Env, daemon: Daemon, keys: dict[str, Path], capsys, tmp_path: Path
):
    trusted_base(world, (principal("r1", ["cpu"]), keys["r1"]))
    head = git(world.project, "rev-parse", "HEAD")
    bus = LocalBus(world, url=daemon.repo())
    bus.runner = signed_runner(world, bus.url, "r1", ("cpu",), keys["r1"])
    passed = bus.run("work", tag="p")
    # A newer run by an honest runner whose key is missing, and which failed (its preset's variable is unset) ...
    honest = make_runner(bus.url, world, "nokey")
    honest.environ = {k: v for k, v in honest.environ.items() if k != "KAKEYA_TEST_COUNTER"}
    rid = bus.client.request("work", {"tag": "n"}, "cpu").id
    assert honest.once(request_id=rid).status == "error"
    # ... a newer forged pass, unsigned, by someone with push access (a copy of the signed one) ...
    forged = bus.client.request("work", {"tag": "f"}, "cpu").id
    Bus(bus.url, world.project).fetch([req_ref("cpu", forged)])
    req = Bus(bus.url, world.project).ls_remote(req_ref("cpu", forged)).refs[req_ref("cpu", forged)]
    files = bus.files(passed)
    result = {
        **json.loads(files["result.json"]),
        "request_id": forged,
        "params": {"mode": "count", "tag": "f", "seconds": 0.0},
    }
    bus.push_done(
        forged,
        req,
        {
            f"{results_path(forged)}/result.json": json.dumps(result).encode(),
            f"{results_path(forged)}/report.json": files["report.json"],
        },
        replace=False,
    )
    # ... and newer runs that did not run at all: expired and cancelled (signed by r1)
    expired, cancelled = bus.not_run()

    summary = tmp_path / "summary.md"
    assert gate(bus, head, "work@cpu", as_json=True) == 0  # the check stays green
    o = outcomes(capsys)["work@cpu"]
    assert (o["status"], o["request_id"], o["trust"]) == ("pass", passed, "signed by r1@cpu")
    assert [(i["request_id"], i["kind"]) for i in o["ignored"]] == [
        (cancelled, "not-run"),
        (expired, "not-run"),
        (forged, "untrusted"),
        (rid, "untrusted"),
    ]
    reasons = {i["request_id"]: i["reason"] for i in o["ignored"]}
    assert reasons[rid].startswith(f"unsigned: done commit {bus.done(rid)[:12]} has no signature")
    assert reasons[cancelled].startswith("cancelled: cancelled before it started")
    # the text and the job summary say who signed it, and list what was ignored and why
    assert gate(bus, head, "work@cpu", summary=summary) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        f"✓ work@cpu: pass — {passed} · signed by r1@cpu · accelerator: none · params: mode=count seconds=0.0 tag=p"
    )
    assert lines[1:] == [
        f"    ignored {cancelled} (not-run): {reasons[cancelled]}",
        f"    ignored {expired} (not-run): {reasons[expired]}",
        f"    ignored {forged} (untrusted): {reasons[forged]}",
        f"    ignored {rid} (untrusted): {reasons[rid]}",
    ]
    text = summary.read_text()
    assert (
        f"| ✓ | `work@cpu` | pass | `{passed}` | `signed by r1@cpu` |" in text
    )  # `@`: quoted, never a mention
    assert (
        f"ignored: {cancelled} (not-run), {expired} (not-run), {forged} (untrusted), {rid} (untrusted)"
        in text
    )
    assert "<details><summary>work@cpu: 4 result(s) ignored</summary>" in text
    # results --verify names the signer of the pass, and refuses the forgery
    out = tmp_path / "res"
    assert main(["results", passed, "--verify", "--remote", bus.url, "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{passed}: signed by r1@cpu\n")
    assert main(["results", forged, "--verify", "--remote", bus.url, "--out", str(tmp_path / "f")]) == 1
    assert "its results are not trusted: unsigned" in capsys.readouterr().err


# --- hardware labels mean hardware -------------------------------------------------------------------------

DEV_PY = WRITE_REPORT_PY.replace('"memory_bytes": None,\n', '"memory_bytes": None, "device": DEVICE,\n', 1)
DEV_PY = "import sys\nDEVICE = sys.argv[1]\n" + DEV_PY + "\nwrite_report()\n"
WORK_DEFAULTS = "mode=count seconds=0.0 tag=x"  # the parameters a `work` run at its defaults had

DEVWORK = {  # a preset that may run on h200, gated on the device its report says it ran on there
    "description": "reports the device it is told",
    "runners": ["cpu", "h200"],
    "timeout_s": 60,
    "argv": ["{python}", "dev.py", "{device}"],
    "params": {
        "device": {"type": "str", "pattern": "[a-zA-Z0-9_:() ]+", "max_length": 40, "default": "cpu (x86_64)"}
    },
    "verdict_free": ["device"],  # as the shipped presets mark theirs
    "report": {"kind": "probe", "schema_version": 1},
    "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 1}],
    "gate_on": {
        "h200": [
            {
                "check": "match",
                "path": "/environment/device",
                "value": "cuda:[0-9]+ [^,]*(, cuda:[0-9]+ [^,]*)*",
            }
        ]
    },
}


@pytest.fixture(name="devwork")
def devwork_fixture(world: Env) -> Env:
    (world.presets / "devwork.yaml").write_text(yaml.safe_dump({"name": "devwork", **DEVWORK}))
    (world.project / "dev.py").write_text(DEV_PY)
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "dev.py")
    return world


@pytest.mark.skipif(CUDA_HERE, reason="this host has CUDA: an h200 runner is not refused here")
def test_an_h200_runner_without_cuda_refuses_to_start_and_forced_its_results_say_so(
    devwork: Env, daemon: Daemon, keys: dict[str, Path], capsys, tmp_path: Path
):
    world = devwork
    url = daemon.repo()
    trusted_base(world, (principal("gpu1", ["h200"]), keys["r1"]))
    head = git(world.project, "rev-parse", "HEAD")
    bus = LocalBus(world, url=url)
    client = bus.client
    rid = client.request("devwork", {}, "h200").id
    # the doctor fails the label, and the runner refuses to start for the same reason: nothing is claimed
    assert main(["runner", "once", "--labels", "h200", "--name", "gpu1", "--remote", url]) == 1
    err = capsys.readouterr().err
    assert "this host lacks the hardware of label(s) h200: label h200 needs CUDA" in err
    assert "--force-labels" in err
    assert main(["runner", "watch", "--labels", "cpu,h200", "--name", "gpu1", "--remote", url]) == 1
    assert "this host lacks the hardware of label(s) h200" in capsys.readouterr().err
    with pytest.raises(KakeyaError, match="lacks the hardware of label.s. h200") as refused:
        Runner(url, config=load_config(), name="x", labels=["cpu", "h200"], workdir=tmp_path / "x")
    assert refused.value.code == "hardware"  # a specific code for agents, not `error`
    with pytest.raises(KakeyaError) as refused:
        host.check_accelerator("h200")
    assert refused.value.code == "hardware"
    assert Bus(url, world.project).ls_remote().entries[rid].state == "requested"
    # forced: it serves, signed, and the result says which labels were forced
    forced = signed_runner(world, url, "gpu1", ("h200",), keys["r1"])
    assert forced.forced_labels == ["h200"]
    assert forced.once(request_id=rid).status == "succeeded"
    result = json.loads(bus.files(rid)["result.json"])
    assert (result["forced_labels"], result["runner_labels"], result["verdict"]) == (
        ["h200"],
        ["h200"],
        "fail",
    )
    # its report says it ran on the cpu: h200 evidence it is not (the runner's verdict, and the gate's)
    assert gate(bus, head, "devwork@h200", as_json=True) == 1
    o = outcomes(capsys)["devwork@h200"]
    assert (o["status"], o["request_id"], o["forced_labels"]) == ("fail", rid, ["h200"])
    assert o["reasons"] == [
        f'{rid}: match /environment/device: /environment/device = "cpu (x86_64)", needs matches '
        "/cuda:[0-9]+ [^,]*(, cuda:[0-9]+ [^,]*)*/"
    ]
    # a forced run whose program claims CUDA passes the device gate, but every row says it was forced
    claims = client.request("devwork", {"device": "cuda:0 (NVIDIA H200)"}, "h200").id
    assert forced.once(request_id=claims).status == "succeeded"
    assert gate(bus, head, "devwork@h200") == 0
    assert capsys.readouterr().out.startswith(
        f"✓ devwork@h200: pass — {claims} · signed by gpu1@h200 · labels forced without their hardware: h200 · "
    )
    # the CLI flag: the runner starts, warns, and serves
    third = client.request("devwork", {}, "h200").id
    assert (
        main(["runner", "once", "--labels", "h200", "--name", "r3", "--force-labels", "--remote", url]) == 0
    )
    assert "serving h200 without the hardware (--force-labels)" in capsys.readouterr().err
    assert json.loads(bus.files(third)["result.json"])["forced_labels"] == ["h200"]


def test_doctor_and_the_runner_share_one_label_check(monkeypatch: pytest.MonkeyPatch):
    assert [host.label_needs(lb) for lb in ("cpu", "cpu-big", "h200", "a100", "gpu", "mac-m4", "mps")] == [
        None,
        None,
        "cuda",
        "cuda",
        "cuda",
        "metal",
        "metal",
    ]
    assert host.check_accelerator("cpu") == "no accelerator needed"
    monkeypatch.setattr(host, "CUDA_PY", "print('NVIDIA H200')")  # a host that has one
    assert host.check_accelerator("h200") == "CUDA: NVIDIA H200"
    assert host.hardware_for(["cpu", "h200"]) == []
    monkeypatch.setattr(host, "CUDA_PY", "import sys; sys.exit('no module named torch')")
    with pytest.raises(
        KakeyaError, match=r"label h200 needs CUDA, but the check failed \(no module named torch\)"
    ):
        host.hardware_for(["cpu", "h200"])
    assert host.hardware_for(["cpu", "h200"], force=True) == ["h200"]
    import bridge.cli.commands.doctor as doctor

    assert doctor.check_accelerator is host.check_accelerator  # one function for both


@pytest.mark.parametrize(
    "name", ["niah-smoke", "niah-ladder", "niah-sink-window", "throughput-code", "restoration-study"]
)
def test_the_repositorys_accelerator_presets_gate_the_device_their_reports_ran_on(name: str):
    preset = load_registry(Path(__file__).resolve().parents[2] / "presets")[name]
    device = next(c for c in preset.checks_for("h200") if c.path == "/environment/device")
    mac = next(c for c in preset.checks_for("mac-m4") if c.path == "/environment/device")
    assert all(c.path != "/environment/device" for c in preset.checks_for("cpu"))

    def status(check: gates.Check, seen: object) -> str:
        return gates.run_check({"environment": {"device": seen}}, check).status

    assert status(device, "cuda:0 (NVIDIA H200)") == "pass"
    assert status(device, "cuda:0 (NVIDIA H200), cuda:1 (NVIDIA H200)") == "pass"
    for bad in ("cpu (x86_64)", "cuda:0 (NVIDIA H200), cpu (x86_64)", "mps (arm)", "", 0):
        assert status(device, bad) == "fail", bad
    assert gates.run_check({"environment": {}}, device).status == "fail"  # no model loaded: no device
    assert status(mac, "mps (arm)") == "pass" and status(mac, "gpu (Apple M4)") == "pass"
    assert status(mac, "cpu (arm)") == "fail"


def test_the_probe_on_h200_needs_cuda():
    probe = load_registry(Path(__file__).resolve().parents[2] / "presets")["probe"]
    assert [c.model_dump() for c in probe.gate_on["h200"]] == [
        {"check": "eq", "path": "/probe/accelerators/cuda/available", "value": True}
    ]


def test_gate_on_names_only_labels_the_preset_runs_on():
    with pytest.raises(ValueError, match="gate_on names label 'h100', which is not in runners"):
        Preset.model_validate({"name": "devwork", **DEVWORK, "gate_on": {"h100": DEVWORK["gate_on"]["h200"]}})
    with pytest.raises(ValueError, match="check 'match' at /x needs a regular expression"):
        gates.parse_checks([{"check": "match", "path": "/x", "value": "("}])
    # a preset without gate_on hashes as before gate_on existed
    plain = {k: v for k, v in DEVWORK.items() if k != "gate_on"}
    assert (
        Preset.model_validate({"name": "d", **plain}).content_hash
        == Preset.model_validate({"name": "d", **plain, "gate_on": {}}).content_hash
    )


# --- NVML provenance ---------------------------------------------------------------------------------------


def fake_pynvml(mig_supported: bool = True, init_fails: bool = False) -> types.ModuleType:
    """A stand-in for nvidia-ml-py's `pynvml` on a host with two H200s, one in MIG mode."""
    nv = types.ModuleType("pynvml")
    calls: list[str] = []

    class NVMLError(Exception):
        pass

    def init() -> None:
        calls.append("init")
        if init_fails:
            raise NVMLError("NVML Shared Library Not Found")

    def mig(handle: int) -> tuple[int, int]:
        if not mig_supported:
            raise NVMLError("Not Supported")
        return (1, 1) if handle == 1 else (0, 0)

    nv.NVMLError = NVMLError  # type: ignore[attr-defined]
    nv.nvmlInit = init  # type: ignore[attr-defined]
    nv.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.15"  # type: ignore[attr-defined]
    nv.nvmlSystemGetCudaDriverVersion = lambda: 12040  # type: ignore[attr-defined]
    nv.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # type: ignore[attr-defined]  # older versions: bytes
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h:08d}"  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=150_323_855_360, used=0, free=0)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMigMode = mig  # type: ignore[attr-defined]
    nv.calls = calls  # type: ignore[attr-defined]
    return nv


def test_nvml_provenance_is_recorded_and_shown_by_gate_pr(
    world: Env, daemon: Daemon, monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path
):
    nv = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    acc = host.host_fingerprint()["accelerator"]
    assert acc["kind"] == "cuda" and acc["source"] == "nvml"
    assert (acc["driver"], acc["cuda"], acc["devices"]) == (
        "550.54.15",
        "12.4",
        ["NVIDIA H200", "NVIDIA H200"],
    )
    assert acc["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-00000000",
        "memory_bytes": 150_323_855_360,
        "mig": "disabled",
    }
    assert acc["gpus"][1]["mig"] == "enabled" and nv.calls == ["init", "shutdown"]  # type: ignore[attr-defined]
    words = "cuda: NVIDIA H200 (140 GiB, MIG disabled), NVIDIA H200 (140 GiB, MIG enabled); driver 550.54.15, CUDA 12.4"
    assert host.accelerator_words(acc) == words
    # a run records it in result.json; gate pr, the job summary and report.html show it
    bus = LocalBus(world, url=daemon.repo())
    head = git(world.project, "rev-parse", "HEAD")
    rid = bus.run("work")
    assert json.loads(bus.files(rid)["result.json"])["host"]["accelerator"] == acc
    summary = tmp_path / "summary.md"
    assert gate(bus, head, "work@cpu", summary=summary) == 0
    assert (
        capsys.readouterr().out
        == f"✓ work@cpu: pass — {rid} · unsigned (allowed) · accelerator: {words} · params: {WORK_DEFAULTS}\n"
    )
    assert f"accelerator: {words}" in summary.read_text()
    assert f"<td>accelerator</td><td>{words}</td>" in bus.files(rid)["report.html"].decode()
    # GPUs without MIG, and a host where NVML does not answer
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(mig_supported=False))
    assert [g["mig"] for g in host.nvml_accelerator()["gpus"]] == [None, None]  # type: ignore[index]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_fails=True))
    assert host.nvml_accelerator() is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: `import pynvml` raises ImportError
    assert host.nvml_accelerator() is None
    assert host.accelerator_words({"kind": "cuda", "gpus": ["not a dict"]}) == "cuda: "  # hostile result.json
    assert host.accelerator_words("nonsense") is None


# --- requirements pin parameters ---------------------------------------------------------------------------

LADDER = {
    "name": "ladder",
    "description": "a ladder",
    "runners": ["cpu", "h200"],
    "timeout_s": 60,
    "argv": ["{python}", "x.py", "{contexts}", "{samples}", "{backend}", "{ratio}", "{fast}"],
    "params": {
        "contexts": {"type": "int_list", "min": 64, "max": 262144, "max_items": 8, "default": [256, 1024]},
        "samples": {"type": "int", "min": 1, "max": 100, "default": 2},
        "backend": {"type": "enum", "choices": ["torch", "mlx"], "default": "torch"},
        "ratio": {"type": "float", "min": 0, "max": 1, "default": 0.5},
        "fast": {"type": "bool", "default": False},
    },
    "report": {"kind": "probe", "schema_version": 1},
}


def test_pins_are_parsed_once_typed_against_the_preset():
    registry = {"ladder": Preset.model_validate(LADDER)}
    req = E.Requirement.parse("ladder@h200  contexts>=65536 samples>=5 backend==torch fast==true", registry)
    assert (req.preset, req.label, [str(p) for p in req.pins]) == (
        "ladder",
        "h200",
        ["contexts>=65536", "samples>=5", "backend==torch", "fast==true"],
    )
    assert str(req) == "ladder@h200 contexts>=65536 samples>=5 backend==torch fast==true"
    base = {"contexts": [65536, 131072], "samples": 5, "backend": "torch", "ratio": 0.5, "fast": True}
    assert req.unmet(base) == []
    assert req.unmet({**base, "contexts": [1024, 65536]}) == ["contexts>=65536: it ran contexts=1024,65536"]
    assert req.unmet({**base, "samples": 4, "fast": False}) == [
        "samples>=5: it ran samples=4",
        "fast==true: it ran fast=false",
    ]
    assert req.unmet({k: v for k, v in base.items() if k != "samples"}) == ["samples>=5: it has no samples"]
    exact = E.Requirement.parse("ladder contexts==256,1024 ratio<0.75 samples<=2 samples>1", registry)
    assert exact.unmet({**base, "contexts": [256, 1024], "ratio": 0.5, "samples": 2, "fast": False}) == []
    # a parameter without a pin counts at the preset's default only
    assert exact.unmet({**base, "contexts": [256, 1024], "samples": 2}) == [
        "fast: it ran fast=true, not the preset's default false (a pin counts other values: fast==true, fast==*)"
    ]
    assert exact.unmet({**base, "contexts": [1024, 256], "ratio": 0.75, "samples": 1, "fast": False}) == [
        "contexts==256,1024: it ran contexts=1024,256",
        "ratio<0.75: it ran ratio=0.75",
        "samples>1: it ran samples=1",
    ]
    assert E.Pin("fast", "==", True).met_by(1) is False and E.Pin("samples", "==", 1).met_by(True) is False
    assert E.Pin("samples", ">=", 1).met_by("5") is False and E.Pin("contexts", ">=", 1).met_by([]) is False
    for text, message in (
        ("ladder@h200 samples=5", "must look like PRESET, PRESET@LABEL or PRESET@LABEL PARAM>=VALUE"),
        ("ladder@h200 samples >= 5", "must look like"),
        ("ladder@h200 depth>=5", "preset ladder has no parameter 'depth' (its parameters: backend, contexts"),
        ("ladder@h200 backend>=torch", "backend>=torch: parameter backend is enum; it takes == only"),
        ("ladder@h200 fast>true", "parameter fast is bool; it takes == only"),
        ("ladder@h200 samples>=500", "samples>=500: samples must be between 1 and 100"),
        ("ladder@h200 samples>=5 samples>=6", "samples>= is pinned twice"),
        ("ladder@h200 contexts>=1024,2048", "takes one number (it bounds every item)"),
        ("ladder@mac samples>=5", "may not run on runner label 'mac'"),
        ("ladder@h200 samples>=5\nx", "must look like"),
    ):
        with pytest.raises(InvalidRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
            E.Requirement.parse(text, registry)


def test_a_run_that_does_not_meet_the_pins_is_not_evidence(world: Env, daemon: Daemon, capsys):
    bus = LocalBus(world, url=daemon.repo())
    head = git(world.project, "rev-parse", "HEAD")
    cheap = bus.run("work", tag="a")  # seconds=0: the cheapest allowed
    assert missing(capsys, bus, head, "work@cpu seconds>=0.2 tag==a") == [
        (
            cheap,
            "pins",
            "its parameters do not meet work@cpu seconds>=0.2 tag==a: seconds>=0.2: it ran seconds=0.0",
        )
    ]
    met = bus.run("work", tag="a", seconds="0.2")
    other = bus.run("work", tag="b", seconds="0.3")  # newer, meets the bound, but not tag==a
    assert gate(bus, head, "work@cpu seconds>=0.2 tag==a", "work@cpu") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"✓ work@cpu seconds>=0.2 tag==a: pass — {met} · ")
    assert (
        lines[1]
        == f'    ignored {other} (pins): its parameters do not meet work@cpu seconds>=0.2 tag==a: tag==a: it ran tag="b"'
    )
    assert lines[2].startswith(f"✓ work@cpu: pass — {cheap} · ")  # unpinned: the newest at the defaults
    # bad pins are refused before the bus is read (exit 2)
    assert gate(bus, head, "work@cpu mode>=count") == 2
    assert "parameter mode is enum; it takes == only" in capsys.readouterr().err


def test_the_required_file_takes_pins_and_says_how_to_provide_them(tmp_path: Path):
    root = Path(__file__).resolve().parents[2]
    script = root / ".github" / "scripts" / "required.py"
    path = tmp_path / "required.yml"
    path.write_text(
        "required:\n  - probe@cpu\n  - niah-ladder@h200 contexts>=65536 samples>5 model==gemma-3-1b\n"
    )

    def required(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), str(path), *args], capture_output=True, text=True)

    out = required("--presets", str(root / "presets"))
    assert out.returncode == 0 and out.stdout.splitlines() == [
        "probe@cpu",
        "niah-ladder@h200 contexts>=65536 samples>5 model==gemma-3-1b",
    ]
    out = required("--presets", str(root / "presets"), "--request-args")
    assert out.stdout.splitlines() == [
        "probe --runner cpu",
        "niah-ladder --runner h200 -p contexts=65536 -p samples=6 -p model=gemma-3-1b",
    ]
    # what the script prints is what kakeya gate pr parses
    registry = load_registry(root / "presets")
    assert [str(r) for r in E.check_requirements(required().stdout.splitlines(), registry)] == [
        "probe@cpu",
        "niah-ladder@h200 contexts>=65536 samples>5 model==gemma-3-1b",
    ]
    path.write_text("required:\n  - niah-ladder@h200 depth>=5\n")
    out = required("--presets", str(root / "presets"))
    assert out.returncode == 2 and "preset niah-ladder has no parameter depth" in out.stderr
    path.write_text("required:\n  - niah-ladder@h200 samples=5\n")
    out = required()
    assert out.returncode == 2 and "must look like PRESET@LABEL [PARAM OP VALUE ...]" in out.stderr


def test_a_newer_run_on_another_label_is_gated_for_its_own_label(world: Env):
    """Without @LABEL any label counts, and the evidence is gated with the checks of the label it ran on."""
    preset = Preset.model_validate({"name": "devwork", **DEVWORK})
    report = {"environment": {"device": "cpu (x86_64)"}, "probe": {"cpu_count": 1}}
    assert [c.check for c in preset.checks_for("h200")] == ["min", "match"]
    assert [c.check for c in preset.checks_for(None)] == ["min"]
    assert E.regate(report, preset, "h200").checks[-1].status == "fail"
    assert E.regate(report, preset, "cpu").checks[-1].check == "min"


def test_what_an_ignored_result_says_cannot_open_html_in_the_job_summary(world: Env, capsys, tmp_path: Path):
    bus = LocalBus(world)
    head = git(world.project, "rev-parse", "HEAD")
    rid = bus.run("work")
    files = bus.files(rid)
    hostile = new_id("work")
    result = {**json.loads(files["result.json"]), "request_id": hostile, "subject": "</details><img src=x>"}
    bus.push_done(
        hostile,
        bus.done(rid),
        {
            MANIFEST_PATH: json.dumps(manifest_dict(hostile, "work", head)).encode(),
            f"{results_path(hostile)}/result.json": json.dumps(result).encode(),
        },
        replace=False,
    )
    summary = tmp_path / "summary.md"
    assert gate(bus, head, "work@cpu", summary=summary) == 0  # the hostile result is ignored, not evidence
    assert f"ignored {hostile} (mismatch)" in capsys.readouterr().out
    text = summary.read_text()
    # the hostile subject is quoted in a code span: as markdown, the only HTML is the summary's own <details>
    assert "`does not belong to " in text and "names subject </details><img src=x>, not " in text
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    html = [t.content for t in tokens if t.type == "html_block"]
    html += [c.content for t in tokens for c in t.children or [] if c.type == "html_inline"]
    assert [h.strip() for h in html] == [
        "<details><summary>work@cpu: 1 result(s) ignored</summary>",
        "</details>",
    ]


def test_a_forged_previous_pass_is_no_baseline(world: Env, daemon: Daemon, keys: dict[str, Path], capsys):
    """An unsigned "previous pass" with an inflated metric, pushed between two signed runs, would make the
    second look like a regression (and a deflated one would hide one): with signers, only signed passes are
    baselines, for the runner and for gate pr."""
    from tests.bridge.test_baseline import BENCH, BENCH_PY

    (world.presets / "bench.yaml").write_text(yaml.safe_dump({**BENCH, "runners": ["cpu"]}))
    (world.project / "bench.py").write_text(BENCH_PY)
    trusted_base(world, (principal("r1", ["cpu"]), keys["r1"]))
    bus = LocalBus(world, url=daemon.repo())
    bus.runner = signed_runner(world, bus.url, "r1", ("cpu",), keys["r1"])

    def measured(value: int) -> str:
        (world.project / "bench.json").write_text(json.dumps({"value": value, "ok": True}))
        git(world.project, "add", "-A")
        git(world.project, "commit", "-qm", f"metric {value}")
        return bus.run("bench")

    first = measured(100)
    forged = bus.client.request("bench", {}, "cpu").id  # a request nobody ran, and a forged pass for it
    Bus(bus.url, world.project).fetch([req_ref("cpu", forged)])
    req = Bus(bus.url, world.project).ls_remote(req_ref("cpu", forged)).refs[req_ref("cpu", forged)]
    files = bus.files(first)
    report = json.loads(files["report.json"])
    bus.push_done(
        forged,
        req,
        {
            f"{results_path(forged)}/result.json": json.dumps(
                {**json.loads(files["result.json"]), "request_id": forged}
            ).encode(),
            f"{results_path(forged)}/report.json": json.dumps(
                {**report, "probe": {**report["probe"], "memory_bytes": 1000}}
            ).encode(),
        },
        replace=False,
    )
    second = measured(95)  # 5 % below the genuine pass (allowed: 10 %), 90 % below the forged one
    verdict = json.loads(bus.files(second)["verdict.json"])
    assert (verdict["status"], verdict["baseline"]["run"]) == ("pass", first)  # the runner's own baseline
    head = git(world.project, "rev-parse", "HEAD")
    assert gate(bus, head, "bench@cpu", as_json=True) == 0
    o = outcomes(capsys)["bench@cpu"]
    assert (o["request_id"], o["verdict"]["baseline"]["run"], o["verdict"]["comparison"]["base"]) == (
        second,
        first,
        100,
    )
