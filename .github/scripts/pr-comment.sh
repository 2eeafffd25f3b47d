#!/usr/bin/env bash
# Keep ONE evidence comment per pull request up to date (.github/workflows/pr-gate.yml): the comment that
# `kakeya gate pr --comment FILE` wrote (bridge/evidence/comment.py) replaces the body of this workflow's earlier
# comment (found by its first line, the marker, and its author, the workflow's token), else it is posted
# as a new one. Through `gh api` (on GitHub's hosted runners; `make` installs it for the tests, which serve
# a fake API): the body goes as a file, never spliced into JSON by hand.
#
# Environment: COMMENT (the file), REPO (owner/name), PR (the number), GH_TOKEN (pull-requests: write),
# KAKEYA_COMMENT_AUTHOR (whose comment is ours; default github-actions[bot], the GITHUB_TOKEN's user).
set -euo pipefail

COMMENT=${COMMENT:?COMMENT is not set}
REPO=${REPO:?REPO is not set}
PR=${PR:?PR is not set}
MARKER='<!-- kakeya-evidence -->'
AUTHOR=${KAKEYA_COMMENT_AUTHOR:-github-actions[bot]}
[[ $PR =~ ^[0-9]+$ ]] || { echo "::error::PR '$PR' is not a pull request number"; exit 1; }

if [ ! -s "$COMMENT" ] || [ "$(head -n 1 "$COMMENT")" != "$MARKER" ]; then
  echo "::warning::the gate wrote no evidence comment (see its step); the pull request's comment is unchanged"
  exit 0
fi
# Someone else's comment that starts with the marker is not ours: only the workflow's own is edited.
id=$(gh api --paginate "repos/$REPO/issues/$PR/comments" \
  --jq ".[] | select(.user.login == \"$AUTHOR\" and (.body | startswith(\"$MARKER\"))) | .id" | head -n 1)
if [ -n "$id" ]; then
  gh api --method PATCH "repos/$REPO/issues/comments/$id" -F "body=@$COMMENT" >/dev/null
  echo "updated the evidence comment $id on #$PR"
else
  gh api --method POST "repos/$REPO/issues/$PR/comments" -F "body=@$COMMENT" >/dev/null
  echo "posted the evidence comment on #$PR"
fi
