#!/usr/bin/env bash
# The body of .github/workflows/regressions.yml: `kakeya history --alert --json` over every preset of
# .github/kakeya-required.yml along BRANCH, then ONE issue per regression: the open issue whose title is the
# alert's title (it starts with "[kakeya regression]" and names the preset, label, metric and commit) gets the
# new body; without one, an issue is opened. Through `gh api` (REST: the list of open issues is read as it
# is now, where GitHub's search would lag behind an issue opened minutes ago); the body goes as a file,
# never spliced into JSON by hand. What a run or a commit says is in code spans in that body
# (bridge/evidence/history.py `alert_markdown`): never a link, a mention or HTML.
#
# Environment: REPO (owner/name), GH_TOKEN (issues: write), KAKEYA_REMOTE (the bus) and GITHUB_TOKEN (to
# read it), BRANCH (default HEAD: the checkout's), ALLOW_UNSIGNED (`true`: --allow-unsigned), KAKEYA (how to
# run kakeya; default `kakeya`). Exit 0 when every regression has its issue (none found is fine), else
# kakeya's exit code or gh's.
set -euo pipefail

HARNESS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
REPO=${REPO:?REPO is not set}
SUMMARY=${GITHUB_STEP_SUMMARY:-/dev/null}
read -r -a KAKEYA <<<"${KAKEYA:-kakeya}"
cd "$HARNESS"

if [ -n "${GITHUB_TOKEN:-}" ] && [ -n "${KAKEYA_REMOTE:-}" ]; then
  basic=$(printf 'x-access-token:%s' "$GITHUB_TOKEN" | base64 | tr -d '\n')
  echo "::add-mask::$basic"
  export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0="http.$KAKEYA_REMOTE.extraheader"
  export GIT_CONFIG_VALUE_0="AUTHORIZATION: basic $basic"
fi

args=(history --alert --json --branch "${BRANCH:-HEAD}")
# who may sign evidence: this checkout's allowed-signers file (as `kakeya gate pr` reads it)
if [ -f .github/kakeya-allowed-signers ]; then args+=(--allowed-signers .github/kakeya-allowed-signers); fi
if [ "${ALLOW_UNSIGNED:-}" = true ]; then args+=(--allow-unsigned); fi

alerts=$(mktemp)
rc=0
"${KAKEYA[@]}" "${args[@]}" >"$alerts" || rc=$?
if [ "$rc" -gt 1 ] || ! jq -e 'select(.event == "alerts")' "$alerts" >/dev/null; then
  echo "::error::kakeya history --alert failed (exit $rc; see above)"
  exit $((rc > 1 ? rc : 1))
fi
count=$(jq -r 'select(.event == "alerts") | .count' "$alerts")
if [ "$count" = 0 ]; then
  echo "no regression at the newest commit with trusted runs" | tee -a "$SUMMARY"
  exit 0
fi

open=$(mktemp)
gh api --paginate "repos/$REPO/issues?state=open&per_page=100" \
  --jq '.[] | select(.pull_request == null) | [.number, .title] | @tsv' >"$open"
body=$(mktemp)
jq -c 'select(.event == "alert")' "$alerts" | while read -r alert; do
  title=$(jq -r .title <<<"$alert")
  jq -r .body <<<"$alert" >"$body"
  number=$(awk -F '\t' -v t="$title" '$2 == t { print $1; exit }' "$open")
  if [ -n "$number" ]; then
    gh api --method PATCH "repos/$REPO/issues/$number" -F "body=@$body" >/dev/null
    echo "updated #$number: $title" | tee -a "$SUMMARY"
  else
    number=$(gh api --method POST "repos/$REPO/issues" -f "title=$title" -F "body=@$body" --jq .number)
    echo "opened #$number: $title" | tee -a "$SUMMARY"
  fi
done
