#!/usr/bin/env bash
# The body of the `kakeya gate` PR check (.github/workflows/pr-gate.yml), run from the trusted checkout
# of the PR's base: re-gate the evidence the bus holds for the PR's head commit against the presets
# listed in .github/kakeya-required.yml. Writes the table (and, when evidence is missing or failing,
# how to ask for it) to the job summary. Exit: that of `kakeya gate pr` (0 pass, 1 fail), 2 when the
# requirements file is not valid.
#
# Evidence counts only as a runner's signed done commit, checked against the base's
# .github/kakeya-allowed-signers. Without that file the check fails and says how to add one, unless the
# repository variable KAKEYA_ALLOW_UNSIGNED is `true` (unsigned evidence, which anyone with push access
# could forge, then counts; each row says `unsigned (allowed)`).
#
# Environment: SUBJECT (the PR's head sha), KAKEYA_REMOTE (the repository), GITHUB_TOKEN (read), PR
# (the pull request number, for the instructions), KAKEYA (how to run kakeya; default `kakeya`),
# ALLOW_UNSIGNED (`true`: pass --allow-unsigned), COMMENT (a file: the pull request's comment is written
# there, with the change against BASE, the base commit; links under $GITHUB_SERVER_URL/$GITHUB_REPOSITORY,
# the bus being that repository), which .github/scripts/pr-comment.sh then posts.
set -uo pipefail

HARNESS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
SUBJECT=${SUBJECT:?SUBJECT is not set}
SUMMARY=${GITHUB_STEP_SUMMARY:-/dev/null}
read -r -a KAKEYA <<<"${KAKEYA:-kakeya}"
cd "$HARNESS" || exit 1

if [ -n "${GITHUB_TOKEN:-}" ] && [ -n "${KAKEYA_REMOTE:-}" ]; then
  basic=$(printf 'x-access-token:%s' "$GITHUB_TOKEN" | base64 | tr -d '\n')
  echo "::add-mask::$basic"
  export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0="http.$KAKEYA_REMOTE.extraheader"
  export GIT_CONFIG_VALUE_0="AUTHORIZATION: basic $basic"
fi

if ! required=$(python3 .github/scripts/required.py .github/kakeya-required.yml --presets presets); then
  echo "::error::.github/kakeya-required.yml on the base branch is not valid (see above)"
  exit 2
fi
if [ -z "$required" ]; then
  echo "no evidence is required (.github/kakeya-required.yml lists none)" | tee -a "$SUMMARY"
  exit 0
fi
args=()
while read -r entry; do args+=(--require "$entry"); done <<<"$required"
# Who may sign evidence: the allowed-signers file of the BASE checkout (this one), never the PR's head,
# which could list its own key. Without one, `kakeya gate pr` refuses, unless unsigned evidence is allowed
# by the repository's own setting (docs/runners.md, Trust).
signers=$HARNESS/.github/kakeya-allowed-signers
if [ -f "$signers" ]; then args+=(--allowed-signers "$signers"); fi
if [ "${ALLOW_UNSIGNED:-}" = true ]; then args+=(--allow-unsigned); fi

table=$(mktemp)
comment=()
if [ -n "${COMMENT:-}" ]; then
  comment=(--comment "$COMMENT")
  if [ -n "${BASE:-}" ]; then comment+=(--base "$BASE"); fi
  if [ -n "${GITHUB_SERVER_URL:-}" ] && [ -n "${GITHUB_REPOSITORY:-}" ]; then
    comment+=(--link-base "$GITHUB_SERVER_URL/$GITHUB_REPOSITORY")
  fi
fi
"${KAKEYA[@]}" gate pr --subject "$SUBJECT" "${args[@]}" --summary "$table" "${comment[@]}"
rc=$?
{
  printf '## Kakeya evidence for %s\n\n' "$SUBJECT"
  cat "$table" 2>/dev/null
  printf '\n'
} >>"$SUMMARY"
if [ "$rc" = 2 ]; then
  echo "::error::kakeya gate pr refused to judge the evidence for $SUBJECT (the job summary says why and what to do)"
fi
if [ "$rc" = 1 ]; then
  echo "::error::evidence for $SUBJECT is missing or failing (the job summary has the table and how to ask for it)"
  how=$(
    printf '### How to provide the evidence\n\n'
    printf 'A maintainer with push access requests each run for this commit, from a clone of the repository:\n\n'
    printf '```sh\n'
    printf 'git fetch origin%s   # the PR head\n' "${PR:+ pull/$PR/head}"
    python3 .github/scripts/required.py .github/kakeya-required.yml --request-args |
      while read -r request; do
        printf 'kakeya request %s --subject %s --wait --remote origin\n' "$request" "$SUBJECT"
      done
    # shellcheck disable=SC2016  # literal backquotes: markdown
    printf '```\n\nthen re-runs this check (Re-run jobs, or `gh run rerun --failed %s`).\n' "${GITHUB_RUN_ID:-RUN_ID}"
  )
  printf '%s\n' "$how" >>"$SUMMARY"
  if [ -n "${COMMENT:-}" ] && [ -s "$COMMENT" ]; then printf '\n%s\n' "$how" >>"$COMMENT"; fi
fi
exit "$rc"
