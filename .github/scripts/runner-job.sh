#!/usr/bin/env bash
# The body of the `kakeya runner` job (.github/workflows/runner.yml), run from the trusted checkout of
# the default branch on a self-hosted runner:
#
#   1. serve $REQUEST (when the job was triggered by a request push) with `kakeya runner once`;
#   2. drain: serve the label's other pending requests until none is left or the time budget is spent
#      (GitHub keeps one pending job per concurrency group, so a trigger may have been dropped: the
#      bus is the queue, and whoever runs next serves it); when the budget runs out with work left,
#      dispatch one more drain job;
#   3. write every served request's results to $RUNNER_TEMP/kakeya-results/<id>/ (uploaded as an
#      artifact) and its summary.md to the job summary.
#
# Environment: LABEL, REQUEST (empty for a drain), KAKEYA_REMOTE, GITHUB_TOKEN (contents: write; plus
# actions: write for the re-dispatch and gate re-runs, statuses: write for the commit statuses), KAKEYA_DRAIN_MINUTES, KAKEYA_VENV (default ~/kakeya-runner/venv,
# made by scripts/setup-runner.sh); KAKEYA_DRAIN_SECONDS overrides the budget in seconds. Exit: that of $REQUEST's outcome (0 succeeded with a passing or no
# verdict), or 1 when the harness could not run.
set -uo pipefail

HARNESS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
VENV=${KAKEYA_VENV:-$HOME/kakeya-runner/venv}
OUT=${RUNNER_TEMP:-${TMPDIR:-/tmp}}/kakeya-results
SUMMARY=${GITHUB_STEP_SUMMARY:-/dev/null}
LABEL=${LABEL:?LABEL is not set}
REQUEST=${REQUEST:-}
BUDGET_S=${KAKEYA_DRAIN_SECONDS:-$(( ${KAKEYA_DRAIN_MINUTES:-480} * 60 ))}
NAME=${KAKEYA_RUNNER_NAME:-${RUNNER_NAME:-$(hostname -s 2>/dev/null || echo runner)}}
NAME=$(printf '%s' "$NAME" | tr -c 'A-Za-z0-9._-' '-')
PY=$VENV/bin/python

error() { printf '::error::%s\n' "$*"; }

if [ ! -x "$PY" ]; then
  error "no Kakeya venv at $VENV on runner $NAME: run scripts/setup-runner.sh on this host, or set KAKEYA_VENV in the Actions runner's .env"
  exit 1
fi

# Credentials for the bus, scoped to its URL, from the environment only: nothing is written to a git
# config file, and the preset's program never sees them (its environment is rebuilt from scratch).
if [ -n "${GITHUB_TOKEN:-}" ] && [ -n "${KAKEYA_REMOTE:-}" ]; then
  basic=$(printf 'x-access-token:%s' "$GITHUB_TOKEN" | base64 | tr -d '\n')
  echo "::add-mask::$basic"
  export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0="http.$KAKEYA_REMOTE.extraheader"
  export GIT_CONFIG_VALUE_0="AUTHORIZATION: basic $basic"
  export KAKEYA_SECRETS="${KAKEYA_SECRETS:-HF_TOKEN,GITHUB_TOKEN,GH_TOKEN},GIT_CONFIG_VALUE_0"
fi

# The harness and presets of the trusted checkout; heavy packages (torch, mlx) from the runner's venv.
export PYTHONPATH=$HARNESS KAKEYA_PRESETS=$HARNESS/presets KAKEYA_RUNNER_NAME=$NAME
# Mirrors and worktrees outlive the job's workspace (which checkout cleans), so fetches stay small.
export KAKEYA_STATE_DIR=${KAKEYA_STATE_DIR:-$HOME/kakeya-runner/state}
kakeya() { (cd "$HARNESS" && "$PY" -m bridge.cli "$@"); }

echo "harness $(git -C "$HARNESS" rev-parse --short HEAD 2>/dev/null || echo '?') from $HARNESS; venv $VENV; runner $NAME; label $LABEL"
mkdir -p "$OUT"

# collect ID [FAILED]: results into $OUT/ID and summary.md into the job summary; prints the outcome's exit
# code. FAILED=1: this job's own `kakeya runner once` for ID failed (no result here is then not another
# runner's doing).
collect() {
  local id=$1 dir=$OUT/$1 failed=${2:-0}
  local links=() run_url=""
  if [ -n "${GITHUB_SERVER_URL:-}" ] && [ -n "${GITHUB_REPOSITORY:-}" ]; then
    # the job summary cannot resolve summary.md's relative links: point them at the done commit's files
    links=(--link-base "$GITHUB_SERVER_URL/$GITHUB_REPOSITORY")
    run_url="$GITHUB_SERVER_URL/$GITHUB_REPOSITORY/actions/runs/${GITHUB_RUN_ID:-0}"
  fi
  if kakeya results "$id" --out "$OUT" "${links[@]}" >&2 && [ -f "$dir/summary.md" ]; then
    {
      cat "$dir/summary.md"
      if [ -n "$run_url" ]; then
        printf '\nAll files: the artifact [kakeya-results-%s-%s-%s](%s#artifacts) (%s/).\n' \
          "$LABEL" "${GITHUB_RUN_ID:-0}" "${GITHUB_RUN_ATTEMPT:-1}" "$run_url" "$id"
      fi
      printf '\n---\n\n'
    } >>"$SUMMARY"
    "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1]))
print(0 if r["status"] == "succeeded" and r.get("verdict") in (None, "pass") else 2 if r["status"] == "rejected" else 1)' \
      "$dir/result.json"
  elif [ "$failed" = 1 ]; then
    # shellcheck disable=SC2016  # literal backquotes: markdown
    printf '### %s\n\nNot served: `kakeya runner once` failed on runner %s (the error is in this job'"'"'s log). The request stays on the bus for the next runner (`kakeya status %s`).\n\n---\n\n' \
      "$id" "$NAME" "$id" >>"$SUMMARY"
    echo 1
  else
    # shellcheck disable=SC2016  # literal backquotes: markdown
    printf '### %s\n\nNo result yet: another runner holds it. It will be on `kakeya/done/%s` (`kakeya wait %s`).\n\n---\n\n' \
      "$id" "$id" "$id" >>"$SUMMARY"
    echo 1
  fi
}

# notify ID: GitHub learns that evidence landed (pushes made with GITHUB_TOKEN trigger no workflow):
# a commit status on the request's subject (context kakeya/PRESET@LABEL, linking this run), then a
# re-run of the subject's failed `kakeya gate` runs (pr-gate.yml), so its PR check turns green by itself.
notify() {
  local result=$OUT/$1/result.json api=${GITHUB_API_URL:-https://api.github.com}/repos/${GITHUB_REPOSITORY:-}
  [ -n "${GITHUB_TOKEN:-}" ] && [ -n "${GITHUB_REPOSITORY:-}" ] && [ -f "$result" ] || return 0
  local run_url=${GITHUB_SERVER_URL:-https://github.com}/$GITHUB_REPOSITORY/actions/runs/${GITHUB_RUN_ID:-0}
  local lines subject body
  lines=$("$PY" -c 'import json, sys; r = json.load(open(sys.argv[1]))
ok = r["status"] == "succeeded" and r.get("verdict") in (None, "pass")
words = "ran, gate failed" if r["status"] == "succeeded" and r.get("verdict") == "fail" else r["status"]
print(r.get("subject") or "")
preset, rid = r["preset"], r["request_id"]
print(json.dumps({"state": "success" if ok else "failure", "context": f"kakeya/{preset}@{sys.argv[2]}",
                  "description": f"{rid}: {words}"[:140], "target_url": sys.argv[3]}))' \
    "$result" "$LABEL" "$run_url") || return 0
  subject=${lines%%$'\n'*} body=${lines#*$'\n'}
  [ -n "$subject" ] || return 0
  curl -fsS -o /dev/null -X POST -H "Authorization: Bearer $GITHUB_TOKEN" -H "Accept: application/vnd.github+json" \
    "$api/statuses/$subject" -d "$body" || error "could not post the commit status for $subject"
  # GitHub records a pull_request_target run with the base's commit as head_sha (a dispatched one with its
  # branch's), never the PR head: the failed runs are found by the commit pr-gate.yml's run-name carries (a
  # match on head_sha would re-run every PR's check on a base that a run served).
  local runs run
  runs=$(curl -fsS -H "Authorization: Bearer $GITHUB_TOKEN" -H "Accept: application/vnd.github+json" \
    "$api/actions/workflows/pr-gate.yml/runs?status=failure&per_page=100" |
    "$PY" -c 'import json, sys
s = sys.argv[1]
runs = json.load(sys.stdin).get("workflow_runs", [])
print(" ".join(str(r["id"]) for r in runs if s in str(r.get("display_title", "")).split()))' \
    "$subject" 2>/dev/null) || runs=""
  for run in $runs; do
    echo "re-running the failed kakeya gate run $run for $subject"
    curl -fsS -o /dev/null -X POST -H "Authorization: Bearer $GITHUB_TOKEN" -H "Accept: application/vnd.github+json" \
      "$api/actions/runs/$run/rerun-failed-jobs" || error "could not re-run kakeya gate run $run"
  done
}

# serve [--request ID]: one `kakeya runner once --json`; prints the id it served, or nothing when idle.
# Fails when the harness itself failed (bus unreachable, bad configuration): no JSON event then.
serve() {
  local out rc id
  out=$(kakeya runner once --json --labels "$LABEL" "$@")
  rc=$?
  printf '%s\n' "$out" >&2
  # the last line is the event: {"event": "served", "id": ...} or {"event": "idle", ...}; anything else
  # (no line, an error event) is a failure of the harness
  if ! id=$(printf '%s\n' "$out" | tail -n 1 | "$PY" -c 'import json, sys
e = json.loads(sys.stdin.read())
if e["event"] not in ("served", "idle"):
    sys.exit(1)
print(e.get("id") or "")' 2>/dev/null); then
    return $((rc == 0 ? 1 : rc))
  fi
  [ -z "$id" ] && return 0
  if [[ $id =~ ^[0-9]{8}T[0-9]{6}\.[0-9]{3}Z-[a-z][a-z0-9-]*-[0-9a-f]{6}$ ]]; then
    echo "$id"
    return 0
  fi
  return $((rc == 0 ? 1 : rc))
}

printf '## Kakeya runner %s (label %s)\n\n' "$NAME" "$LABEL" >>"$SUMMARY"
started=$SECONDS
code=0
if [ -n "$REQUEST" ]; then
  failed=0
  if ! serve --request "$REQUEST" >/dev/null; then
    error "kakeya runner once --request $REQUEST failed (see above)"
    code=1 failed=1
  fi
  outcome=$(collect "$REQUEST" "$failed")
  notify "$REQUEST"
  [ "$code" != 0 ] || code=$outcome
fi

# Drain the label's queue; `ended` says why the loop stopped: idle, error or budget.
served=0 ended=budget
while [ $((SECONDS - started)) -lt "$BUDGET_S" ]; do
  if ! id=$(serve); then
    error "draining label $LABEL failed (see above); pending requests stay on the bus for the next runner"
    ended=error
    break
  fi
  if [ -z "$id" ]; then ended=idle; break; fi
  served=$((served + 1))
  collect "$id" >/dev/null
  notify "$id"
done
echo "drained $served more request(s) for $LABEL"

# Out of time with work possibly left: one more drain job (it queues behind this one in the label's
# concurrency group). Only after progress, so a budget too small to serve anything cannot loop.
if [ "$ended" = budget ] && [ "$BUDGET_S" -gt 0 ] && { [ "$served" -gt 0 ] || [ -n "$REQUEST" ]; }; then
  workflow=${GITHUB_WORKFLOW_REF:-}
  workflow=${workflow%%@*}
  workflow=${workflow##*/}
  workflow=${workflow:-runner.yml}
  echo "the drain budget (${BUDGET_S} s) ran out: dispatching $workflow for label $LABEL"
  if ! curl -fsS -X POST -H "Authorization: Bearer ${GITHUB_TOKEN:-}" -H "Accept: application/vnd.github+json" \
      "${GITHUB_API_URL:-https://api.github.com}/repos/${GITHUB_REPOSITORY:-}/actions/workflows/$workflow/dispatches" \
      -d "{\"ref\":\"${DEFAULT_BRANCH:-main}\",\"inputs\":{\"label\":\"$LABEL\"}}"; then
    error "could not dispatch a follow-up drain: the remaining requests wait for the next trigger or kakeya runner watch"
  fi
fi
exit "$code"
