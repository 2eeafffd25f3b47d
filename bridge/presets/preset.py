"""Presets: the allowlist of what a runner may execute (presets/*.yaml -> typed models).

A preset is an argv template, typed and bounded parameters, runner labels, a time limit, an
environment, the report kind it produces and its gate checks. A parameter fills exactly one argv
element: template elements are either literals or exactly `{name}`, never a mix, so no value can
add, split or prefix arguments. Nothing here runs anything.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bridge.core.errors import InvalidRequest, KakeyaError
from bridge.core.names import NAME_RE
from bridge.presets.grammar import DrafterParam, PolicyParam
from bridge.presets.params import (
    BoolParam,
    EnumParam,
    FloatParam,
    IntListParam,
    IntParam,
    ModelParam,
    PathParam,
    StrParam,
    did_you_mean,
    resolve_model,
)
from gates import Check, parse_checks

BUILTINS = ("python", "report", "run_dir")
_PARAM = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_PLACEHOLDER = re.compile(r"^\{([a-z_][a-z0-9_]*)\}$")
_EMBEDDED = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_ENV_REF = re.compile(r"\$\{ENV:([A-Za-z_][A-Za-z0-9_]*)\}")

Param = Annotated[
    IntParam
    | FloatParam
    | BoolParam
    | EnumParam
    | StrParam
    | IntListParam
    | PathParam
    | ModelParam
    | PolicyParam
    | DrafterParam,
    Field(discriminator="type"),
]


class ReportSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    schema_version: int = Field(ge=1)


class BaselineSpec(BaseModel):
    """`baseline: {from: previous-pass, metric: /summary/decode_tok_s, max_regression_pct: 10}`: the runner
    compares each report with the last passing report of the same preset and runner label on the bus."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    from_: Literal["previous-pass"] = Field(alias="from")
    metric: str
    max_regression_pct: float = Field(ge=0, allow_inf_nan=False)
    higher_is_better: bool = True
    # JSON pointer to the metric's per-repeat samples: a regression must then also be beyond the noise
    samples: str | None = None

    @field_validator("metric")
    @classmethod
    def _metric(cls, metric: str) -> str:
        if not metric.startswith("/") or "*" in metric.split("/"):
            raise ValueError(
                f"baseline metric {metric!r} must be a JSON pointer to one number, e.g. "
                "/summary/decode_tok_s (no '*')"
            )
        return metric


class Limits(BaseModel):
    """`limits: {memory_mb: 4096, processes: 256, file_mb: 1024}`: what one local run may use of the host
    (bridge/run/isolation.py's `run_limits`; unset: its default). A run that reaches one ends in `error` naming it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    memory_mb: int | None = Field(default=None, ge=16, le=1 << 24)  # per process (RLIMIT_DATA)
    processes: int | None = Field(default=None, ge=4, le=1 << 20)  # tasks of the run's user (RLIMIT_NPROC)
    file_mb: int | None = Field(default=None, ge=1, le=1 << 24)  # the largest file, /tmp's too (RLIMIT_FSIZE)


class Resources(BaseModel):
    """`resources: {gpus: 1, cpus: 8, memory: 64G}`: what a run needs of a node. A scheduler executor
    (bridge/run/slurm.py) asks for it (`--gres`, `--cpus-per-task`, `--mem`); the local executor ignores it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpus: int = Field(default=0, ge=0, le=64)
    cpus: int = Field(default=1, ge=1, le=1024)
    memory: str | None = Field(default=None, pattern=r"^[1-9][0-9]{0,6}[KMGT]?$")  # Slurm's --mem: 64G


# The presets as shipped when `content_hash` became one rule (fields at their defaults left out) and their
# policy and drafter parameters typed (`type: policy`, `type: drafter`, a regex string before): the rule's
# hash of each -> the hash its runs were signed with then, so that their evidence still matches. Frozen: a
# definition changed since hashes by the rule and its alias goes (compression-table: one drafter parameter,
# issue 30; tests/bridge/test_preset_hash.py).
SIGNED_AS: dict[str, str] = {
    "sha256:49431350318e59166f28a96074ff70f6756316596488c973331c065f3330b081": "sha256:284b28b8c4f27ee12badf7156fd128b7fd1b81a4c80fd2c87e9b6c66b4fe9068",  # niah-ladder
    "sha256:179ef6651feeeed9133519f73c1c6e581d55dca43f6c26c61b518ba2139b5f17": "sha256:21e1ffcfd177b91f8a2ea96d072f523038015f6d1ff0ed91ab6cb9238120e9bb",  # niah-sink-window
    "sha256:bb118e34707771af9424edd5ba9850b6271a96eafcc11c97b1e68c0df1e519a2": "sha256:2bb708bc7fbf52925671a1a80cb5d97a9b2977a0eab91e72a99a6d894fa2c663",  # niah-smoke
    "sha256:1754c6dcb4cf665e2123814285d8f64d042f8f10b28985f9064c45d6dcf99add": "sha256:d2ccdeae8685841480b1cf28a33f877ff16399d0561476e5d09b92cd2510cb2a",  # parity
    "sha256:f85dd1ac848fc67d705f0ee6037f7167b0d6aec6041361e849e1630628529521": "sha256:46bfce41857ccf4d5d181bab2893c7d71b2d6ebfe32a586e828c7cfcc7bb2094",  # probe
    "sha256:e9e3698ee66f3675172c0572f62846882116d9c164b9dc98be202cf399a06adc": "sha256:70ad00fd2fc03f621149c9b9e352a7217a83309c856c43d2bdaa6c69ad2eb72b",  # restoration-study
    "sha256:18a3d58705bb5901c59f0b002ebd17edf19bacca5a938fce63b330de8746e525": "sha256:3e5ea04260f9e3ee3f0583ff968e0e982e8f5e52323c4e8485f314f8cfe4fd45",  # throughput-code
}  # fmt: skip


class Preset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    runners: list[str] = Field(min_length=1)
    timeout_s: int = Field(ge=1, le=7 * 24 * 3600)
    argv: list[str] = Field(min_length=1)
    params: dict[str, Param] = {}
    env: dict[str, str] = {}
    secrets: list[str] = []
    report: ReportSpec
    gate: list[Check] = []
    # more checks on a runner label, e.g. on h200 the report's device must be CUDA (`checks_for`)
    gate_on: dict[str, list[Check]] = {}
    baseline: BaselineSpec | None = None
    # none (the default): the run's own network namespace, loopback only; host: the host's network, by name
    network: Literal["host", "none"] = "none"
    limits: Limits = Limits()
    resources: Resources | None = None
    # parameters whose value does not change what the verdict means (device, threads): a requirement without
    # pins on them counts runs at any of their values; every other parameter counts at its default only
    # (bridge/evidence/requirements.py). Not part of `content_hash`: it is how evidence is judged, not what ran.
    verdict_free: list[str] = []

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.match(name):
            raise ValueError(f"name {name!r} must be lowercase letters, digits and dashes")
        return name

    @field_validator("gate", mode="before")
    @classmethod
    def _gate(cls, raw: Any) -> list[Check]:
        return parse_checks(raw)

    @field_validator("gate_on", mode="before")
    @classmethod
    def _gate_on(cls, raw: Any) -> dict[str, list[Check]]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise ValueError("gate_on must map a runner label to a list of checks")
        return {str(label): parse_checks(checks) for label, checks in raw.items()}

    @model_validator(mode="after")
    def _template(self) -> Preset:
        for label in self.gate_on:
            if label not in self.runners:
                raise ValueError(f"gate_on names label {label!r}, which is not in runners")
        for pname, spec in self.params.items():
            if not _PARAM.fullmatch(pname):
                raise ValueError(
                    f"parameter name {pname!r} must be lowercase letters, digits and underscores"
                )
            if pname in BUILTINS:
                raise ValueError(f"parameter {pname!r} shadows the builtin {{{pname}}}")
            if spec.default is not None:
                try:
                    spec.parse(spec.default)
                except ValueError as exc:
                    raise ValueError(f"default of parameter {pname!r} ({spec.default!r}) {exc}") from None
            elif not spec.required:
                raise ValueError(f"parameter {pname!r} needs a default or `required: true`")
        for pname in self.verdict_free:
            if pname not in self.params:
                raise ValueError(f"verdict_free names {pname!r}, which is not a parameter")
        used = set()
        for element in self.argv:
            m = _PLACEHOLDER.fullmatch(element)
            if m:
                if m.group(1) not in self.params and m.group(1) not in BUILTINS:
                    raise ValueError(f"argv element {element!r} names no parameter or builtin")
                used.add(m.group(1))
            elif any(n in self.params or n in BUILTINS for n in _EMBEDDED.findall(element)):
                raise ValueError(
                    f"argv element {element!r}: a placeholder must be a whole element, e.g. '{{model}}'"
                )
        unused = set(self.params) - used
        if unused:
            raise ValueError(f"parameters {sorted(unused)} are never used in argv")
        for key in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"env name {key!r} is not a valid variable name")
        return self

    def checks_for(self, label: str | None) -> list[Check]:
        """The gate of a run on runner label `label`: `gate`, then `gate_on[label]`."""
        return [*self.gate, *self.gate_on.get(label or "", [])]

    def allows(self, label: str) -> bool:
        """Whether this preset may run on runner label `label`."""
        return label in self.runners

    def check_runs_on(self, label: str) -> None:
        """InvalidRequest unless this preset may run on runner label `label` (the one rule, for requests,
        runners and evidence requirements)."""
        if not self.allows(label):
            raise InvalidRequest(
                f"preset {self.name} may not run on runner label {label!r}: "
                f"preset {self.name} runs on {', '.join(self.runners)}, not {label}",
                code="wrong-label",
            )

    @property
    def content_hash(self) -> str:
        """sha256 of the canonical definition, what the runner ran: its JSON (independent of YAML formatting)
        with every field at its default left out, so that a field added later, at its default, changes no
        hash. A definition shipped before this rule keeps the hash its runs were signed with (`SIGNED_AS`)."""
        data = self.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude={"verdict_free"})
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        digest = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
        return SIGNED_AS.get(digest, digest)

    def validate_params(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Typed values for every parameter (defaults filled); InvalidRequest names what is wrong."""
        unknown = sorted(set(raw) - set(self.params))
        if unknown:
            known = ", ".join(sorted(self.params)) or "none"
            raise InvalidRequest(
                f"preset {self.name}: unknown parameter {unknown[0]!r}{did_you_mean(unknown[0], self.params)} "
                f"(known: {known})",
                code="bad-param",
            )
        values: dict[str, Any] = {}
        for pname, spec in self.params.items():
            if pname in raw:
                try:
                    values[pname] = spec.parse(raw[pname])
                except ValueError as exc:
                    raise InvalidRequest(
                        f"preset {self.name}: parameter {pname}={raw[pname]!r} {exc}", code="bad-param"
                    ) from None
            elif spec.required:
                raise InvalidRequest(
                    f"preset {self.name}: parameter {pname!r} is required ({spec.type}, {spec.bounds()})",
                    code="bad-param",
                )
            else:
                values[pname] = spec.parse(spec.default)
        return values

    def render_argv(
        self, values: Mapping[str, Any], builtins: Mapping[str, str], environ: Mapping[str, str]
    ) -> list[str]:
        """One argv element per template element; model names are resolved on this (runner) host."""
        argv = []
        for element in self.argv:
            m = _PLACEHOLDER.fullmatch(element)
            if not m:
                argv.append(element)
                continue
            key = m.group(1)
            if key in builtins:
                argv.append(str(builtins[key]))
                continue
            spec = self.params[key]
            rendered = spec.render(values[key])
            if isinstance(spec, ModelParam):
                rendered = resolve_model(rendered, environ)
            argv.append(rendered)
        return argv

    def render_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The preset's env with `${ENV:NAME}` resolved from the runner's environment (never the request)."""
        out = {}
        for key, template in self.env.items():
            missing = [n for n in _ENV_REF.findall(template) if n not in environ]
            if missing:
                raise KakeyaError(
                    f"preset {self.name}: env {key} needs ${{ENV:{missing[0]}}} but {missing[0]} "
                    f"is not set on this runner"
                )
            out[key] = _ENV_REF.sub(lambda m: environ[m.group(1)], template)
        return out

    def params_schema(self) -> dict[str, Any]:
        """The parameters as one JSON Schema object (what `presets --json`, `kakeya mcp`'s tools and agents
        check values against): each parameter's type with its real minimum/maximum/enum/pattern, the
        required ones listed, nothing else allowed. `validate_params` stays the rule that decides."""
        return {
            "type": "object",
            "properties": {n: s.json_schema() for n, s in self.params.items()},
            "required": [n for n, s in self.params.items() if s.required],
            "additionalProperties": False,
        }

    def summary(self) -> dict[str, Any]:
        """What `kakeya presets` shows."""
        return {
            "name": self.name,
            "description": self.description,
            "runners": self.runners,
            "timeout_s": self.timeout_s,
            "report": self.report.model_dump(),
            "params": self.params_schema(),
            **({"verdict_free": self.verdict_free} if self.verdict_free else {}),
            "gate": [c.model_dump(exclude_none=True) for c in self.gate],
            **(
                {
                    "gate_on": {
                        lb: [c.model_dump(exclude_none=True) for c in checks]
                        for lb, checks in self.gate_on.items()
                    }
                }
                if self.gate_on
                else {}
            ),
            **(
                {"baseline": self.baseline.model_dump(by_alias=True, exclude_none=True)}
                if self.baseline
                else {}
            ),
            "hash": self.content_hash,
        }
