#!/usr/bin/env bash
# Make this host a Kakeya runner: a Linux GPU or CPU box, or an Apple-Silicon Mac. Idempotent:
# running it again checks everything, changes only what differs, and gives the same result.
#
#   scripts/setup-runner.sh --labels h200                 # venv + packages + models dir + doctor
#   scripts/setup-runner.sh --labels h200 --service       # ... and `kakeya runner watch` as a service
#   scripts/setup-runner.sh --labels h200 --service --dry-run   # print what it would do; write nothing
#   scripts/setup-runner.sh --labels h200 --slurm --partition gpu --gpu-type h200 --service   # a Slurm login node
#
# Run it from the runner's trusted checkout of the repository (the default branch): the venv gets
# this checkout installed in editable mode, and the runner takes its presets from here.
# docs/runners.md explains the rest.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/setup-runner.sh [options]

  --labels L1,L2       runner labels this host serves (default: $KAKEYA_LABELS, else cpu)
  --name NAME          runner name (default: $KAKEYA_RUNNER_NAME, else the short hostname)
  --remote URL         the bus: the repository requests are pushed to (default: $KAKEYA_REMOTE,
                       else this checkout's origin URL)
  --venv PATH          virtualenv to create or reuse (default: $KAKEYA_VENV, else ~/kakeya-runner/venv)
  --python PYTHON      interpreter that creates the venv, 3.11 or newer (default: python3)
  --torch MODE         auto | cuda | cpu | none (default auto: cuda on Linux when nvidia-smi lists a
                       GPU, else cpu; on macOS the PyPI build, which uses Metal/MPS)
  --torch-version V    (default: $KAKEYA_TORCH_VERSION, else 2.13.0)
  --torch-index URL    index for the torch wheel (default: PyPI for cuda and macOS,
                       https://download.pytorch.org/whl/cpu for cpu)
  --extras E1,E2       kakeya extras (default: torch,serve on Linux GPU hosts, torch,mlx,serve otherwise: serve for serve-bench)
  --skip-install       install nothing: reuse the venv as it is (it must already hold kakeya)
  --no-doctor          do not run `kakeya doctor`
  --service            install `kakeya runner watch` as a user service (systemd on Linux,
                       launchd on macOS) and (re)start it
  --dry-run-service    write the service file, print the commands that would load it, run none
  --dry-run            print what would be done (venv, packages, directories, key, run user, files,
                       service commands) and do none of it: nothing is written, nothing is run
  --run-user NAME      the dedicated unprivileged user runs are started as (default: kakeya-run); created
                       with `useradd --system` when this script runs as root on Linux
  --gpus N             with --service on Linux: one runner per GPU, a templated unit
                       kakeya-runner@.service with CUDA_VISIBLE_DEVICES=<i> and the name <name>-gpu<i>,
                       instances 0..N-1 (each serves one request at a time)
  --actions-runner DIR also write KAKEYA_VENV (and KAKEYA_MODELS) into DIR/.env, the environment
                       file of a GitHub Actions runner installed in DIR
  --os linux|macos     act as on this OS (default: this host's); for preparing service files
  --slurm              this host is a Slurm login node: the label's runs are Slurm jobs. Writes the
                       runner config (kakeya.toml in this checkout: [executors.LABEL] executor = "slurm");
                       one label only. With it:
  --partition P        --partition of each job (default: Slurm's default partition)
  --account A          --account (a dedicated job account is best)
  --qos Q              --qos
  --gpu-type T         --gres=gpu:T:N (default: any GPU type)
  --slurm-gpus N       GPUs a run asks for when its preset names none (default 1; 0 for a CPU partition)
  --signing-key PATH   the runner's signing key (default ~/.config/kakeya/signing-key); on a Slurm login node
                       keep it on a disk the compute nodes do not mount (docs/runners.md, "A Slurm cluster")
  -h, --help           this help

Models: a preset's model NAME is looked up in $KAKEYA_MODELS/NAME, then ~/kakeya-models/NAME.
EOF
}

die() { printf 'setup-runner: error: %s\n' "$*" >&2; exit 1; }
say() { printf '%s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }

# install_file PATH MODE: the content on stdin; rewrites PATH only when it differs.
install_file() {
  local path=$1 mode=$2 tmp text
  if [ "$WRITE" = 0 ]; then  # --dry-run: compare, write nothing
    text=$(cat; printf x)
    if [ -f "$path" ] && printf '%s' "${text%x}" | cmp -s - "$path"; then say "unchanged: $path"
    else say "would write: $path (mode $mode)"
    fi
    return 0
  fi
  mkdir -p "$(dirname "$path")"
  tmp=$(mktemp "$path.XXXXXX")
  cat >"$tmp"
  chmod "$mode" "$tmp"
  if [ -f "$path" ] && cmp -s "$tmp" "$path"; then
    rm -f "$tmp"
    say "unchanged: $path"
  else
    mv -f "$tmp" "$path"
    say "wrote: $path"
  fi
}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
[ -n "${HOME:-}" ] || die "HOME is not set"

LABELS=${KAKEYA_LABELS:-}
NAME=${KAKEYA_RUNNER_NAME:-}
REMOTE=${KAKEYA_REMOTE:-}
VENV=${KAKEYA_VENV:-$HOME/kakeya-runner/venv}
PYTHON=python3
TORCH=auto
TORCH_VERSION=${KAKEYA_TORCH_VERSION:-2.13.0}
TORCH_INDEX=""
EXTRAS=""
SKIP_INSTALL=0
DOCTOR=1
SERVICE=0
DRY_RUN=0  # run no system command (useradd, apt-get, systemctl, launchctl)
WRITE=1    # 0 (--dry-run): write no file or directory either; say what would be written
GRACE=${KAKEYA_STOP_GRACE:-300}  # a stopped service lets the current run go on this long (s), then ends it
ACTIONS_DIR=""
OS=""
PER_GPU=0
RUN_USER=${KAKEYA_RUN_USER:-kakeya-run}
SLURM=0
PARTITION=""
ACCOUNT=""
QOS=""
GPU_TYPE=""
SLURM_GPUS=1
KEY=""

while [ $# -gt 0 ]; do
  opt=$1
  case $opt in
    --*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;
  esac
  case $opt in
    --labels|--name|--remote|--venv|--python|--torch|--torch-version|--torch-index|--extras|--actions-runner|--os|--gpus|--run-user|--partition|--account|--qos|--gpu-type|--slurm-gpus|--signing-key)
      [ $# -ge 2 ] || die "$opt needs a value"
      val=$2; shift 2
      case $opt in
        --labels) LABELS=$val ;; --name) NAME=$val ;; --remote) REMOTE=$val ;; --venv) VENV=$val ;;
        --python) PYTHON=$val ;; --torch) TORCH=$val ;; --torch-version) TORCH_VERSION=$val ;;
        --torch-index) TORCH_INDEX=$val ;; --extras) EXTRAS=$val ;; --actions-runner) ACTIONS_DIR=$val ;;
        --os) OS=$val ;; --gpus) PER_GPU=$val ;; --run-user) RUN_USER=$val ;;
        --partition) PARTITION=$val ;; --account) ACCOUNT=$val ;; --qos) QOS=$val ;; --gpu-type) GPU_TYPE=$val ;;
        --slurm-gpus) SLURM_GPUS=$val ;; --signing-key) KEY=$val ;;
      esac ;;
    --skip-install) SKIP_INSTALL=1; shift ;;
    --no-doctor) DOCTOR=0; shift ;;
    --service) SERVICE=1; shift ;;
    --slurm) SLURM=1; shift ;;
    --dry-run-service) SERVICE=1; DRY_RUN=1; shift ;;
    --dry-run) DRY_RUN=1; WRITE=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $opt" ;;
  esac
done

# --- checks of the inputs ---------------------------------------------------------------------------

if [ -z "$OS" ]; then
  case $(uname -s) in
    Linux) OS=linux ;;
    Darwin) OS=macos ;;
    *) die "unsupported OS $(uname -s): Kakeya runners are Linux or macOS hosts" ;;
  esac
fi
case $OS in linux|macos) ;; *) die "--os must be linux or macos, not '$OS'" ;; esac
case $TORCH in auto|cuda|cpu|none) ;; *) die "--torch must be auto, cuda, cpu or none, not '$TORCH'" ;; esac
[ "$OS" = macos ] && [ "$TORCH" = cuda ] && die "--torch cuda: there is no CUDA on macOS"
[[ $PER_GPU =~ ^[0-9]+$ ]] || die "--gpus must be a number of GPUs, not '$PER_GPU'"
[ "$PER_GPU" = 0 ] || [ "$OS" = linux ] || die "--gpus: one runner per GPU is for Linux (CUDA) hosts"
[[ $GRACE =~ ^[0-9]+$ ]] || die "KAKEYA_STOP_GRACE must be a number of seconds, not '$GRACE'"
[[ $RUN_USER =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || die "--run-user '$RUN_USER' must be a user name (lowercase, e.g. kakeya-run)"
for pair in "--partition=$PARTITION" "--account=$ACCOUNT" "--qos=$QOS" "--gpu-type=$GPU_TYPE"; do
  [[ ${pair#*=} =~ ^[A-Za-z0-9_.+-]*$ ]] || die "${pair%%=*} '${pair#*=}' must be a Slurm name (letters, digits, '_', '.', '+', '-')"
  [ "$SLURM" = 1 ] || [ -z "${pair#*=}" ] || die "${pair%%=*} is for a Slurm label: add --slurm"
done
[[ $SLURM_GPUS =~ ^[0-9]+$ ]] && [ "$SLURM_GPUS" -le 64 ] || die "--slurm-gpus must be a number of GPUs (0 to 64), not '$SLURM_GPUS'"
if [ "$SLURM" = 1 ]; then
  [ "$OS" = linux ] || die "--slurm: a Slurm login node is a Linux host"
  [ "$PER_GPU" = 0 ] || die "--slurm and --gpus: Slurm places each run on a GPU itself (one runner serves the label)"
fi

LABELS=${LABELS:-cpu}
LABELS=${LABELS// /}
IFS=, read -r -a label_list <<<"$LABELS"
[ ${#label_list[@]} -gt 0 ] || die "--labels is empty"
[ "$SLURM" = 0 ] || [ ${#label_list[@]} = 1 ] || die "--slurm: one label per Slurm runner (e.g. --labels h200), not '$LABELS'"
for label in "${label_list[@]}"; do
  [[ $label =~ ^[a-z0-9][a-z0-9_-]{0,62}$ ]] ||
    die "label '$label' must be lowercase letters, digits, '-' or '_' (at most 63), e.g. h200 or mac-m4"
done
if [ -z "$NAME" ]; then
  NAME=$(hostname -s 2>/dev/null || hostname 2>/dev/null || echo runner)
fi
[[ $NAME =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$ ]] || die "runner name '$NAME' must be letters, digits, '.', '_' or '-'"
if [ -z "$REMOTE" ]; then
  REMOTE=$(git -C "$REPO" remote get-url origin 2>/dev/null || true)
fi
case $VENV in /*) ;; *) VENV=$PWD/$VENV ;; esac
for path in "$REPO" "$VENV" "$HOME"; do
  case $path in *[[:space:]]*) die "path '$path' contains whitespace: service files cannot quote it safely" ;; esac
done

# --- plan ---------------------------------------------------------------------------------------------

GPUS=""
if [ "$OS" = linux ] && command -v nvidia-smi >/dev/null 2>&1; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  [ "$GPUS" != 0 ] || GPUS=""
fi
if [ "$TORCH" = auto ]; then
  if [ "$OS" = macos ]; then TORCH=macos
  elif [ -n "$GPUS" ]; then TORCH=cuda
  else TORCH=cpu
  fi
fi
[ "$OS" = macos ] && [ "$TORCH" = cpu ] && TORCH=macos
if [ -z "$EXTRAS" ]; then
  case $TORCH in
    cuda) EXTRAS=torch,serve ;;
    none) EXTRAS=mlx,serve ;;
    *) EXTRAS=torch,mlx,serve ;;
  esac
  [ "$TORCH" = none ] && [ "$OS" = linux ] && EXTRAS=""
fi
if [ -z "$TORCH_INDEX" ] && [ "$TORCH" = cpu ]; then
  TORCH_INDEX=https://download.pytorch.org/whl/cpu
fi
case $TORCH in
  cuda) torch_desc="torch==$TORCH_VERSION, CUDA build (nvidia-smi lists ${GPUS:-no} GPU(s))" ;;
  cpu) torch_desc="torch==$TORCH_VERSION, CPU build" ;;
  macos) torch_desc="torch==$TORCH_VERSION, macOS build (Metal/MPS)" ;;
  none) torch_desc="no torch" ;;
esac

say "Kakeya runner setup"
say "  checkout  $REPO (trusted copy: harness and presets come from here)"
say "  os        $OS"
say "  labels    $LABELS"
say "  name      $NAME"
say "  remote    ${REMOTE:-(none: the embedded local bus)}"
say "  venv      $VENV"
say "  packages  $torch_desc${TORCH_INDEX:+ from $TORCH_INDEX}; kakeya[${EXTRAS}] from the checkout"
if [ "$(id -u)" = 0 ]; then
  say "  warning   running as root: a run can do whatever this user can; use a dedicated unprivileged user"
fi

# --- venv and packages --------------------------------------------------------------------------------

sha256() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

step "venv and packages"
PY=$VENV/bin/python
if [ "$SKIP_INSTALL" = 1 ]; then
  [ -x "$PY" ] || die "--skip-install: there is no venv at $VENV (run once without --skip-install)"
  [ -x "$VENV/bin/kakeya" ] || die "--skip-install: $VENV has no kakeya (run once without --skip-install)"
  say "skipped installing (--skip-install); using $VENV as it is"
else
  if [ -x "$PY" ]; then
    say "venv exists: $VENV"
  else
    command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON on PATH: install Python 3.11 or newer, or pass --python"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
      die "$PYTHON is Python $("$PYTHON" -c 'import platform; print(platform.python_version())'); Kakeya needs 3.11 or newer (pass --python)"
    if [ "$WRITE" = 0 ]; then
      say "would create the venv: $PYTHON -m venv $VENV"
    else
      mkdir -p "$(dirname "$VENV")"
      "$PYTHON" -m venv "$VENV"
      say "venv created: $VENV"
    fi
  fi
  if [ -x "$PY" ]; then
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "the venv at $VENV is older than Python 3.11: remove it or pass another --venv"
  fi
  stamp_file=$VENV/.kakeya-runner-stamp
  stamp="repo=$REPO extras=$EXTRAS torch=$TORCH-$TORCH_VERSION index=$TORCH_INDEX pyproject=$(sha256 "$REPO/pyproject.toml")"
  if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && [ -x "$VENV/bin/kakeya" ]; then
    say "packages are up to date (same checkout, extras, torch and pyproject.toml as the last setup)"
  elif [ "$WRITE" = 0 ]; then
    [ "$TORCH" = none ] || say "would install (unless the venv has it): $torch_desc${TORCH_INDEX:+ from $TORCH_INDEX}"
    say "would install: kakeya[${EXTRAS}] from $REPO (editable), and stamp $stamp_file"
  else
    pip=("$PY" -m pip install --quiet --disable-pip-version-check)
    "${pip[@]}" --upgrade pip
    have=$("$PY" -c 'from importlib import metadata as m; print(m.version("torch"))' 2>/dev/null || true)
    case $TORCH in
      cuda) ok="$TORCH_VERSION $TORCH_VERSION+cu*" ;;
      cpu) ok="$TORCH_VERSION $TORCH_VERSION+cpu" ;;
      macos) ok="$TORCH_VERSION" ;;
      none) ok="" ;;
    esac
    torch_ok=0
    for pattern in $ok; do
      # shellcheck disable=SC2053  # $pattern is a glob on purpose
      [[ $have == $pattern ]] && torch_ok=1
    done
    if [ "$TORCH" = none ]; then
      say "torch: not installed (--torch none)"
    elif [ "$torch_ok" = 1 ]; then
      say "torch $have is installed"
    else
      say "installing $torch_desc (this can take a while)"
      if [ -z "$TORCH_INDEX" ]; then
        "${pip[@]}" "torch==$TORCH_VERSION"
      elif ! "${pip[@]}" --timeout 20 --retries 1 "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX"; then
        # as the Makefile's torch target: an index that cannot be reached (or lacks a dependency) is not fatal
        say "the torch index $TORCH_INDEX is not reachable (or lacks a dependency): torch from the package registry"
        "${pip[@]}" "torch==$TORCH_VERSION"
      fi
    fi
    say "installing kakeya[${EXTRAS}] from $REPO (editable)"
    "${pip[@]}" -e "$REPO${EXTRAS:+[$EXTRAS]}"
    printf '%s\n' "$stamp" >"$stamp_file"
  fi
fi
installed_from=$(cd / && "$PY" -c 'import bridge, os; print(os.path.dirname(os.path.dirname(os.path.realpath(bridge.__file__))))' 2>/dev/null || true)
if [ "$installed_from" != "$REPO" ] && [ -x "$PY" ]; then
  say "warning: the venv's kakeya comes from ${installed_from:-nowhere}, not from $REPO"
fi

# A root runner starts each program as the run user (nobody in the bubblewrap sandbox): the venv's Python,
# as named and resolved (pyenv, uv and conda keep theirs under a home that may be mode 700), must be open to it.
# blocked_for_others PATH: the first directory above PATH that others may not search, or PATH itself when
# others may not read and run it; nothing when nothing blocks.
blocked_for_others() {
  local target dir real
  real=$(readlink -f "$1" 2>/dev/null || printf '%s' "$1")
  for target in "$1" "$real"; do
    dir=$(dirname "$target")
    while :; do
      if [ -z "$(find "$dir" -maxdepth 0 -perm -001 2>/dev/null)" ]; then printf '%s' "$dir"; return 0; fi
      [ "$dir" != / ] || break
      dir=$(dirname "$dir")
    done
  done
  [ -n "$(find "$real" -maxdepth 0 -perm -005 2>/dev/null)" ] || printf '%s' "$real"
}
if [ "$(id -u)" = 0 ]; then
  interpreter=$PY
  [ -e "$interpreter" ] || interpreter=$(command -v "$PYTHON" 2>/dev/null || true)
  blocked=""
  [ -z "$interpreter" ] || blocked=$(blocked_for_others "$interpreter")
  if [ -n "$blocked" ]; then
    say "warning: the run user ($RUN_USER; nobody in the sandbox) cannot start $interpreter: $blocked is not open"
    say "  to other users, so every run would fail with 'Permission denied'. Make the venv from a Python other"
    say "  users can read (--python /usr/bin/python3.11, or a pyenv/uv/conda Python outside a private home), or"
    say "  open it: chmod o+x on each directory above it, chmod o+rx on the interpreter"
  fi
fi

# --- models ---------------------------------------------------------------------------------------------

step "models"
MODELS_HOME=$HOME/kakeya-models
if [ -d "$MODELS_HOME" ]; then :
elif [ "$WRITE" = 0 ]; then say "would create: $MODELS_HOME"
else mkdir -p "$MODELS_HOME"
fi
say "A preset's model NAME (a parameter like model=gemma-3-1b) is looked up, on the runner, in:"
if [ -n "${KAKEYA_MODELS:-}" ]; then
  if [ -d "$KAKEYA_MODELS" ]; then say "  1. \$KAKEYA_MODELS/NAME   ($KAKEYA_MODELS)"
  else say "  1. \$KAKEYA_MODELS/NAME   ($KAKEYA_MODELS — warning: this directory does not exist)"
  fi
else
  say "  1. \$KAKEYA_MODELS/NAME   (KAKEYA_MODELS is not set)"
fi
say "  2. ~/kakeya-models/NAME  ($MODELS_HOME)"
say "Put each model there as a Hugging Face model directory (config.json, tokenizer, *.safetensors),"
say "or a symlink to one. zoo:NAME models ship with the repository and need nothing."
found=$(find "$MODELS_HOME" ${KAKEYA_MODELS:+"$KAKEYA_MODELS"} -mindepth 1 -maxdepth 1 2>/dev/null | sort || true)
if [ -n "$found" ]; then
  say "Models on this host:"
  printf '%s\n' "$found" | sed 's/^/  /'
else
  say "No models on this host yet."
fi

# --- signing key ---------------------------------------------------------------------------------------------

CONFIG_HOME=${XDG_CONFIG_HOME:-$HOME/.config}
KEY=${KEY:-$CONFIG_HOME/kakeya/signing-key}
case $KEY in /*) ;; *) KEY=$PWD/$KEY ;; esac
SECRETS_DIR=$CONFIG_HOME/kakeya/secrets
step "signing key"
if [ -f "$KEY" ]; then
  say "kept: $KEY"
elif [ "$WRITE" = 0 ]; then
  say "would make: $KEY (ed25519, no passphrase), and print its allowed-signers line"
else
  mkdir -p "$(dirname "$KEY")"
  command -v ssh-keygen >/dev/null 2>&1 || die "no ssh-keygen on PATH: install OpenSSH (the runner signs its results with an SSH key)"
  ssh-keygen -q -t ed25519 -N "" -C "kakeya runner $NAME" -f "$KEY" </dev/null >/dev/null || die "ssh-keygen could not make $KEY"
  say "made: $KEY (ed25519, no passphrase: the runner signs unattended)"
fi
PRINCIPAL="$NAME@${LABELS//,/+}"
if [ -f "$KEY" ]; then
  [ "$WRITE" = 0 ] || chmod 600 "$KEY"
  read -r key_type key_data _ <"$KEY.pub"
  say "The runner signs its claim and done commits with it. For the PR gate to accept its evidence, commit"
  say "this line to .github/kakeya-allowed-signers on the default branch (docs/runners.md, \"Trust\"):"
  say ""
  say "  $PRINCIPAL namespaces=\"git\" $key_type $key_data"
fi
if [ "$WRITE" = 0 ]; then
  [ -d "$SECRETS_DIR" ] || say "would create: $SECRETS_DIR (mode 700)"
else
  mkdir -p "$SECRETS_DIR"
  chmod 700 "$SECRETS_DIR"
fi
say ""
say "The runner's own secrets go in $SECRETS_DIR (mode 700), never in its environment: e.g."
say "git-credentials (mode 600) with https://x-access-token:TOKEN@github.com, what it pushes to the bus with."

# --- the sandbox (bubblewrap) -------------------------------------------------------------------------------------

step "sandbox: bubblewrap, which every run is started in (isolation auto)"
if [ "$OS" != linux ]; then
  say "macOS: no bubblewrap; runs are started as the dedicated user below"
elif command -v bwrap >/dev/null 2>&1; then
  say "bubblewrap installed: $(bwrap --version 2>/dev/null || echo bwrap)"
else
  if command -v apt-get >/dev/null 2>&1; then install=(apt-get install -y bubblewrap)
  elif command -v dnf >/dev/null 2>&1; then install=(dnf install -y bubblewrap)
  else install=(); fi
  if [ "${#install[@]}" = 0 ]; then
    say "bubblewrap is not installed and neither apt-get nor dnf is here: install the package 'bubblewrap' with"
    say "this system's package manager; until then runs get a weaker isolation (\`kakeya doctor\` says which)"
  elif [ "$(id -u)" != 0 ]; then
    say "bubblewrap is not installed: ask an administrator for \`${install[*]}\`; until then runs get a weaker"
    say "isolation (\`kakeya doctor\` says which)"
  elif [ "$DRY_RUN" = 1 ]; then
    say "would run: ${install[*]}"
  else
    say "+ ${install[*]}"
    "${install[@]}" || die "${install[*]} failed: install bubblewrap, then run this script again"
  fi
fi

# --- run user (isolation) --------------------------------------------------------------------------------------

step "isolation: runs as a dedicated user ($RUN_USER) where this host allows it"
if id -u "$RUN_USER" >/dev/null 2>&1; then
  say "run user exists: $RUN_USER (uid $(id -u "$RUN_USER"))"
elif [ "$(id -u)" != 0 ]; then
  say "not root: no run user made. The runner uses isolation auto: a user namespace where the kernel allows"
  say "it (\`kakeya doctor\` says which); for a dedicated user, an administrator runs this script as root"
elif [ "$OS" = linux ]; then
  if [ "$DRY_RUN" = 1 ]; then
    say "would run: useradd --system --no-create-home --shell /usr/sbin/nologin $RUN_USER"
  else
    say "+ useradd --system --no-create-home --shell /usr/sbin/nologin $RUN_USER"
    useradd --system --no-create-home --shell /usr/sbin/nologin "$RUN_USER" || die "useradd $RUN_USER failed"
    say "made the run user: $RUN_USER"
  fi
else
  say "macOS: make the run user once with System Settings > Users & Groups (a Standard user named $RUN_USER)"
fi
say "runner config: isolation = auto, run_user = $RUN_USER (each run in a bubblewrap sandbox that shows it"
say "nothing of the runner's; a runner started as root runs each program there as $RUN_USER; without"
say "bubblewrap: as $RUN_USER, else in a user namespace where permitted; recorded in each result.json)"

# --- Slurm ------------------------------------------------------------------------------------------------

# The runner's config: kakeya.toml in this checkout (the service runs here); written only for --slurm.
CONFIG_FILE=$REPO/kakeya.toml
SLURM_MARK="# Written by scripts/setup-runner.sh --slurm; rerun it to change this file."
ours() { [ -f "$CONFIG_FILE" ] && [ "$(head -n 1 "$CONFIG_FILE")" = "$SLURM_MARK" ]; }
if [ "$SLURM" = 1 ]; then
  step "Slurm: label $LABELS runs as Slurm jobs (this host is a login node)"
  slurm_config() {
    printf '%s\n' "$SLURM_MARK" \
      "# Label $LABELS: each run is a Slurm job (docs/runners.md, \"A Slurm cluster\")." \
      "[executors.$LABELS]" \
      'executor = "slurm"' \
      "partition = \"$PARTITION\"" \
      "account = \"$ACCOUNT\"" \
      "qos = \"$QOS\"" \
      "gpu_type = \"$GPU_TYPE\"" \
      "gpus = $SLURM_GPUS  # asked for (--gres) where a run's preset names no resources"
  }
  if [ -f "$CONFIG_FILE" ] && ! ours; then
    die "$CONFIG_FILE exists and was not written by this script: add to it yourself: $(slurm_config | tail -n +3 | tr '\n' ';' | sed 's/;/; /g')"
  fi
  slurm_config | install_file "$CONFIG_FILE" 644
  command -v sbatch >/dev/null 2>&1 ||
    say "warning: no sbatch on PATH: this host needs Slurm's client commands (sbatch, squeue, scontrol, scancel)"
  say "Each job runs this checkout ($REPO), its venv ($VENV) and writes under the state directory"
  say "(${KAKEYA_STATE_DIR:-$REPO/.kakeya}/slurm-jobs): all of them, and the models (KAKEYA_MODELS), must be on a"
  say "filesystem the compute nodes share, at the same paths. Install bubblewrap on the compute nodes: a"
  say "signing runner's job refuses to run a program where its node gives no sandbox."
  case $KEY in
    "$HOME"/*) say "warning: the signing key $KEY lies in this home directory; where the compute nodes mount it, move"
               say "  the key to a disk only this host reads (--signing-key /var/lib/kakeya/signing-key)" ;;
  esac
  say "Keeping the runner alive on a login node: docs/runners.md, \"Slurm site checklist\"."
elif ours; then
  if [ "$WRITE" = 0 ]; then say "would remove: $CONFIG_FILE (the Slurm config of an earlier --slurm)"
  else rm -f "$CONFIG_FILE"; say "removed: $CONFIG_FILE (the Slurm config of an earlier --slurm)"
  fi
fi

# --- doctor -----------------------------------------------------------------------------------------------

doctor_rc=0
step "kakeya doctor"
export KAKEYA_LABELS=$LABELS KAKEYA_RUNNER_NAME=$NAME KAKEYA_SIGNING_KEY=$KEY KAKEYA_ISOLATION=auto
export KAKEYA_RUN_USER=$RUN_USER KAKEYA_SECRETS_DIR=$SECRETS_DIR
if [ -n "$REMOTE" ]; then export KAKEYA_REMOTE=$REMOTE; fi
if [ "$DOCTOR" = 0 ]; then
  say "skipped (--no-doctor)"
elif [ "$WRITE" = 0 ]; then
  say "would run: kakeya doctor (it can write: the embedded bus, objects it fetches, Python's caches)"
elif ! (cd "$REPO" && "$VENV/bin/kakeya" doctor --help >/dev/null 2>&1); then
  say "this version of kakeya has no doctor command; skipped"
else
  (cd "$REPO" && "$VENV/bin/kakeya" doctor) || doctor_rc=$?
  [ "$doctor_rc" = 0 ] || say "kakeya doctor reported problems (exit $doctor_rc): see above"
fi

# --- service ------------------------------------------------------------------------------------------------

# run COMMAND...: print it (dry run) or run it; a failure stops the script with a hint.
run() {
  if [ "$DRY_RUN" = 1 ]; then
    say "would run: $*"
    return 0
  fi
  say "+ $*"
  local rc=0
  "$@" || rc=$?
  [ "$rc" = 0 ] || die "'$*' failed (exit $rc). $SERVICE_HINT"
}

# The kakeya-runner units an earlier setup enabled (`systemctl --user enable` links them here).
WANTS=$CONFIG_HOME/systemd/user/default.target.wants
enabled_units() {
  local link
  for link in "$WANTS"/kakeya-runner.service "$WANTS"/kakeya-runner@*.service; do
    if [ -e "$link" ] || [ -L "$link" ]; then printf '%s\n' "${link##*/}"; fi
  done
}
# retire_units WANTED...: disable and stop each kakeya-runner unit an earlier setup enabled that is not WANTED
# (a single runner after --gpus N, fewer GPUs than before, per-GPU runners after a single one).
retire_units() {
  local unit
  for unit in $(enabled_units); do
    case " $* " in *" $unit "*) ;; *) run systemctl --user disable --now "$unit" ;; esac
  done
}
# remove_file PATH: a file this script wrote earlier and no longer wants.
remove_file() {
  if [ ! -e "$1" ]; then :
  elif [ "$WRITE" = 0 ]; then say "would remove: $1"
  else rm -f "$1"; say "removed: $1"
  fi
}

# per_gpu_units: --gpus N: the unit as a template, kakeya-runner@.service: instance <i> sees GPU <i> alone
# (CUDA_VISIBLE_DEVICES) and is runner <name>-gpu<i> (its own mirror and worktrees); instances 0..N-1 run
# in place of the single unit, so N requests run at once, one per GPU.
per_gpu_units() {
  local template=$CONFIG_HOME/systemd/user/kakeya-runner@.service instances=() i
  for ((i = 0; i < PER_GPU; i++)); do instances+=("kakeya-runner@$i.service"); done
  retire_units "${instances[@]}"
  unit_text | sed -e "s|^Environment=\"KAKEYA_RUNNER_NAME=\(.*\)\"\$|Environment=\"KAKEYA_RUNNER_NAME=\1-gpu%i\"\nEnvironment=\"CUDA_VISIBLE_DEVICES=%i\"|" \
    -e "s|^Description=Kakeya runner \(.*\) (labels|Description=Kakeya runner \1 on GPU %i (labels|" |
    install_file "$template" 644
  remove_file "$UNIT"  # the single runner's unit
  run systemctl --user daemon-reload
  run systemctl --user enable "${instances[@]}"
  run systemctl --user restart "${instances[@]}"
}

xml() { local s=$1; s=${s//&/&amp;}; s=${s//</&lt;}; s=${s//>/&gt;}; printf '%s' "$s"; }

ENV_FILE=$CONFIG_HOME/kakeya/runner.env
SERVICE_PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
[ "$OS" = macos ] && SERVICE_PATH=/opt/homebrew/bin:$SERVICE_PATH
SERVICE_PATH=$VENV/bin:$SERVICE_PATH
service_env=(
  "KAKEYA_LABELS=$LABELS"
  "KAKEYA_RUNNER_NAME=$NAME"
  "KAKEYA_REMOTE=$REMOTE"
  "KAKEYA_SIGNING_KEY=$KEY"
  "KAKEYA_ISOLATION=auto"
  "KAKEYA_RUN_USER=$RUN_USER"
  "KAKEYA_SECRETS_DIR=$SECRETS_DIR"
)
if [ -n "${KAKEYA_MODELS:-}" ]; then service_env+=("KAKEYA_MODELS=$KAKEYA_MODELS"); fi
service_env+=("PATH=$SERVICE_PATH" "PYTHONUNBUFFERED=1")
[ "$OS" = linux ] || service_env+=("KAKEYA_STOP_GRACE=$GRACE")  # the systemd unit says it next to its timeout

if [ "$SERVICE" = 1 ]; then
  step "service: kakeya runner watch --labels $LABELS"
  [ -n "$REMOTE" ] || say "warning: no --remote and no origin: the service would serve the embedded local bus only"
  if [ -f "$ENV_FILE" ]; then
    say "kept: $ENV_FILE (secrets for runs, e.g. HF_TOKEN=...; never printed)"
  else
    install_file "$ENV_FILE" 600 <<'EOF'
# Environment for `kakeya runner watch` (read by the service; keep this file mode 600).
# Secrets a preset needs, e.g.
#   HF_TOKEN=hf_...
# Values of HF_TOKEN, GITHUB_TOKEN and GH_TOKEN (and of the names in KAKEYA_SECRETS) are
# redacted from every log and file a run writes.
EOF
  fi
  if [ "$OS" = linux ]; then
    UNIT=$CONFIG_HOME/systemd/user/kakeya-runner.service
    unit_text() {
      printf '%s\n' "# Written by scripts/setup-runner.sh; rerun it to change this file." \
        "[Unit]" \
        "Description=Kakeya runner $NAME (labels: $LABELS)" \
        "Wants=network-online.target" \
        "After=network-online.target" \
        "" \
        "[Service]" \
        "Type=simple" \
        "WorkingDirectory=$REPO"
      for kv in "${service_env[@]}"; do
        kv=${kv//%/%%}; kv=${kv//\\/\\\\}; kv=${kv//\"/\\\"}
        printf 'Environment="%s"\n' "$kv"
      done
      printf '%s\n' "EnvironmentFile=-$ENV_FILE" \
        "ExecStart=$VENV/bin/kakeya runner watch --labels $LABELS" \
        "Restart=always" \
        "RestartSec=10" \
        "# Stop: SIGTERM to kakeya alone (mixed), which takes no new request and lets the current run go on" \
        "# for KAKEYA_STOP_GRACE s, then ends it; either way the request ends in a done commit. Only then" \
        "# (TimeoutStopSec) does systemd SIGKILL whatever is left in the unit's cgroup." \
        "Environment=KAKEYA_STOP_GRACE=$GRACE" \
        "KillMode=mixed" \
        "KillSignal=SIGTERM" \
        "TimeoutStopSec=$((GRACE + 60))" \
        "" \
        "[Install]" \
        "WantedBy=default.target"
    }
    SERVICE_HINT="systemctl --user needs the user's own session: log in as $(id -un) (ssh, or machinectl shell $(id -un)@), not sudo -u; if lingering is not allowed, an administrator runs: loginctl enable-linger $(id -un)"
    [ "$SLURM" = 0 ] || SERVICE_HINT="$SERVICE_HINT. On a login node where lingering is off: scrontab or a service VM (docs/runners.md, \"Slurm site checklist\")"
    run loginctl enable-linger "$(id -un)"
    if [ "$PER_GPU" -gt 0 ]; then
      per_gpu_units
      say "logs: journalctl --user -u 'kakeya-runner@*' -f   (one GPU's runner: -u kakeya-runner@0)"
    else
      retire_units kakeya-runner.service
      unit_text | install_file "$UNIT" 644
      remove_file "$CONFIG_HOME/systemd/user/kakeya-runner@.service"  # the per-GPU template of an earlier --gpus
      run systemctl --user daemon-reload
      run systemctl --user enable kakeya-runner.service
      run systemctl --user restart kakeya-runner.service
      say "logs: journalctl --user -u kakeya-runner -f"
    fi
  else
    AGENT=dev.kakeya.runner
    PLIST=$HOME/Library/LaunchAgents/$AGENT.plist
    LOG=$HOME/Library/Logs/kakeya-runner.log
    {
      printf '%s\n' '<?xml version="1.0" encoding="UTF-8"?>' \
        '<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">' \
        '<!-- Written by scripts/setup-runner.sh; rerun it to change this file. -->' \
        '<plist version="1.0">' '<dict>' \
        "  <key>Label</key><string>$AGENT</string>" \
        '  <key>ProgramArguments</key>' '  <array>'
      # sh reads the secrets file (launchd has no EnvironmentFile), then becomes kakeya.
      # shellcheck disable=SC2016  # expanded by that sh, not here
      for arg in /bin/sh -c 'set -a; if [ -f "$1" ]; then . "$1"; fi; set +a; shift; exec "$@"' kakeya-runner \
          "$ENV_FILE" "$VENV/bin/kakeya" runner watch --labels "$LABELS"; do
        printf '    <string>%s</string>\n' "$(xml "$arg")"
      done
      printf '%s\n' '  </array>' "  <key>WorkingDirectory</key><string>$(xml "$REPO")</string>" \
        '  <key>EnvironmentVariables</key>' '  <dict>'
      for kv in "${service_env[@]}"; do
        printf '    <key>%s</key><string>%s</string>\n' "$(xml "${kv%%=*}")" "$(xml "${kv#*=}")"
      done
      printf '%s\n' '  </dict>' \
        '  <key>RunAtLoad</key><true/>' \
        '  <key>KeepAlive</key><true/>' \
        '  <key>ThrottleInterval</key><integer>10</integer>' \
        '  <!-- Stop: SIGTERM; kakeya lets the current run go on for KAKEYA_STOP_GRACE s, then ends it (a done' \
        '       commit either way); launchd sends SIGKILL only after ExitTimeOut. -->' \
        "  <key>ExitTimeOut</key><integer>$((GRACE + 60))</integer>" \
        "  <key>StandardOutPath</key><string>$(xml "$LOG")</string>" \
        "  <key>StandardErrorPath</key><string>$(xml "$LOG")</string>" \
        '</dict>' '</plist>'
    } | install_file "$PLIST" 644
    uid=$(id -u)
    SERVICE_HINT="launchctl gui/$uid needs a logged-in GUI session of $(id -un) (log in once on the Mac, or enable automatic login)"
    if [ "$DRY_RUN" = 1 ]; then
      say "would run: launchctl bootout gui/$uid/$AGENT (if loaded)"
    elif launchctl print "gui/$uid/$AGENT" >/dev/null 2>&1; then
      # the agent gets SIGTERM: its runner finishes the current run (KAKEYA_STOP_GRACE), launchd kills it only
      # after ExitTimeOut; the new agent starts once the old one is gone
      say "+ launchctl bootout gui/$uid/$AGENT (a run in progress finishes first: up to $((GRACE + 60)) s)"
      launchctl bootout "gui/$uid/$AGENT" 2>/dev/null || true
      waited=0
      while launchctl print "gui/$uid/$AGENT" >/dev/null 2>&1; do
        [ "$waited" -lt $((GRACE + 60)) ] || die "the runner agent $AGENT is still loaded after $waited s"
        sleep 1
        waited=$((waited + 1))
      done
    fi
    run launchctl enable "gui/$uid/$AGENT"
    run launchctl bootstrap "gui/$uid" "$PLIST"
    say "logs: tail -f $LOG"
  fi
fi

# --- GitHub Actions runner environment ---------------------------------------------------------------------

if [ -n "$ACTIONS_DIR" ]; then
  step "GitHub Actions runner environment: $ACTIONS_DIR/.env"
  [ -d "$ACTIONS_DIR" ] || die "--actions-runner $ACTIONS_DIR is not a directory (install the Actions runner there first)"
  entries=("KAKEYA_VENV=$VENV" "KAKEYA_SIGNING_KEY=$KEY" "KAKEYA_ISOLATION=auto" "KAKEYA_RUN_USER=$RUN_USER")
  if [ -n "${KAKEYA_MODELS:-}" ]; then entries+=("KAKEYA_MODELS=$KAKEYA_MODELS"); fi
  {
    if [ -f "$ACTIONS_DIR/.env" ]; then grep -v -E '^(KAKEYA_VENV|KAKEYA_MODELS|KAKEYA_SIGNING_KEY|KAKEYA_ISOLATION|KAKEYA_RUN_USER)=' "$ACTIONS_DIR/.env" || true; fi
    printf '%s\n' "${entries[@]}"
  } | install_file "$ACTIONS_DIR/.env" 644
  say "restart the Actions runner (./svc.sh stop && ./svc.sh start in $ACTIONS_DIR) so its jobs see this"
fi

step "done"
say "runner $NAME serves: $LABELS"
if [ "$SERVICE" = 0 ] && [ "$OS" = linux ] && [ -n "$(enabled_units)" ]; then
  say "note: an earlier --service left these enabled, unchanged now (without --service): $(enabled_units | tr '\n' ' ')"
  say "  stop them with: systemctl --user disable --now $(enabled_units | tr '\n' ' ')"
fi
if [ "$SERVICE" = 0 ]; then
  say "serve requests by hand:   (cd $REPO && KAKEYA_SIGNING_KEY=$KEY KAKEYA_ISOLATION=auto KAKEYA_RUN_USER=$RUN_USER KAKEYA_SECRETS_DIR=$SECRETS_DIR $VENV/bin/kakeya runner watch --labels $LABELS)"
  say "or as a service:          scripts/setup-runner.sh --labels $LABELS --service"
fi
exit "$doctor_rc"
