#!/usr/bin/env bash
# Times Ansible and pyinfra on the files node-bench deploys (FILES files, content
# "orc bench file <i>\n", mode 0644, as an unprivileged user over SSH): a first run into a fresh
# directory, then the same run again with nothing to change. Not part of CI.
#
# It starts no server: give it an sshd, e.g. the one `node-bench --keep-sshd` keeps running and
# prints this command line for:
#
#   tests/compare/run.sh --host 127.0.0.1 --port PORT --user orctest --key KEYFILE --dir DIR [--files 1000] [--only ansible|pyinfra]
#
# DIR must be writable by the user; each run writes below DIR/ansible-<time> and DIR/pyinfra-<time>.
# The tools are installed from PyPI into a virtualenv (ORC_COMPARE_VENV, default
# /tmp/orc-compare-venv) if it is missing. Settings: Ansible with pipelining, ControlMaster/
# ControlPersist, no fact gathering (forks do not matter: one host); pyinfra's defaults (one
# persistent paramiko connection), the directory created once instead of checked per file.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
host=127.0.0.1 port=22 user="" key="" dir="" files=1000 only=""
while [ $# -gt 0 ]; do
    case "$1" in
        --host) host="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --user) user="$2"; shift 2 ;;
        --key) key="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --files) files="$2"; shift 2 ;;
        --only) only="$2"; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
[ -n "$user" ] && [ -n "$key" ] && [ -n "$dir" ] || {
    echo "usage: $0 --host H --port P --user U --key KEYFILE --dir DIR [--files N] [--only ansible|pyinfra]" >&2
    exit 2
}

venv="${ORC_COMPARE_VENV:-/tmp/orc-compare-venv}"
if [ ! -x "$venv/bin/ansible-playbook" ] || [ ! -x "$venv/bin/pyinfra" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet ansible-core pyinfra
fi
export PATH="$venv/bin:$PATH"

work="$(mktemp -d /tmp/orc-compare-XXXXXX)"
trap 'rm -rf "$work"' EXIT
# The node's host key, checked by both tools (not switched off).
ssh-keyscan -p "$port" "$host" > "$work/known_hosts" 2>/dev/null
ssh_opts=(-o "UserKnownHostsFile=$work/known_hosts" -o StrictHostKeyChecking=yes -o BatchMode=yes -i "$key" -p "$port")

stamp="$(date +%s)"
echo "node: $user@$host:$port, $files files per run"
echo "versions: $(ansible-playbook --version | sed -n 1p | tr -d '[]'), python $(python3 -c 'import platform; print(platform.python_version())'), $(pyinfra --version)"
echo "          $(ssh -V 2>&1)"

now() { date +%s.%N; }
report() { # label start end
    awk -v l="$1" -v s="$2" -v e="$3" -v n="$files" 'BEGIN { t = e - s; printf "  %-34s %8.2f s  %8.1f files/s\n", l, t, n / t }'
}
# Every file is there with its content (first file, last file and the count).
check() { # directory
    local last=$((files - 1)) got
    got="$(ssh "${ssh_opts[@]}" "$user@$host" \
        "ls '$1' | wc -l; cat '$1/f00000.conf' '$1/$(printf 'f%05d.conf' "$last")'; stat -c %a '$1/f00000.conf'")"
    local want
    want="$(printf '%s\norc bench file 0\norc bench file %s\n644' "$files" "$last")"
    [ "$got" = "$want" ] || { echo "  files in $1 are not as expected:"; echo "$got"; exit 1; }
}

# Ansible.
if [ "$only" != pyinfra ]; then
cat > "$work/ansible.cfg" <<EOF
[defaults]
host_key_checking = True
forks = 5
[ssh_connection]
pipelining = True
ssh_args = -o ControlMaster=auto -o ControlPersist=60s -o UserKnownHostsFile=$work/known_hosts -o StrictHostKeyChecking=yes
control_path_dir = $work/cp
EOF
printf 'bench ansible_host=%s ansible_port=%s ansible_user=%s ansible_ssh_private_key_file=%s ansible_python_interpreter=/usr/bin/python3\n' \
    "$host" "$port" "$user" "$key" > "$work/inventory"
target="$dir/ansible-$stamp"
echo "Ansible (ansible.builtin.copy per file, pipelining, ControlPersist) into $target:"
for run in "first run" "second run (no change)"; do
    start="$(now)"
    ANSIBLE_CONFIG="$work/ansible.cfg" ansible-playbook -i "$work/inventory" "$here/files.yml" \
        -e "dir=$target files=$files" > "$work/ansible.log" 2>&1 || { cat "$work/ansible.log"; exit 1; }
    end="$(now)"
    report "$run" "$start" "$end"
    echo "    $(grep -E '^bench ' "$work/ansible.log" | tr -s ' ')"
    if [ "$run" = "first run" ]; then check "$target"; fi
done
fi

# pyinfra.
[ "$only" != ansible ] || exit 0
target="$dir/pyinfra-$stamp"
echo "pyinfra (files.put per file) into $target:"
for run in "first run" "second run (no change)"; do
    start="$(now)"
    ORC_COMPARE_DIR="$target" ORC_COMPARE_FILES="$files" pyinfra -y \
        --ssh-user "$user" --ssh-port "$port" --ssh-key "$key" \
        --data "ssh_known_hosts_file=$work/known_hosts" --data ssh_strict_host_key_checking=yes \
        "$host" "$here/deploy.py" > "$work/pyinfra.log" 2>&1 || { cat "$work/pyinfra.log"; exit 1; }
    end="$(now)"
    report "$run" "$start" "$end"
    echo "    $(grep -E 'Grand total' "$work/pyinfra.log" | tr -s ' ') (operations: hosts, success, error, no change)"
    if [ "$run" = "first run" ]; then check "$target"; fi
done
