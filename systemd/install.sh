#!/bin/sh
# Install mqd's systemd units and a starting config. `make install-systemd` runs it (as root).
#
#   sh systemd/install.sh            install, verify, `systemctl daemon-reload`
#   sh systemd/install.sh --dry-run  say what would be done, change nothing
#
# Environment:
#   MQD_BIN          the mqd executable [default: ./.venv/bin/mqd, else `command -v mqd`]
#   DESTDIR          staging root for packaging [default: none]; no daemon-reload with it
#   UNITDIR          [/etc/systemd/system]     CONFDIR  [/etc/mqd]
#   DOCDIR           [/usr/share/doc/mqd]: README.md, docs/ and systemd/README.md are installed there,
#                    and the units' Documentation= points at them (`systemctl help mqd`)
#   SYSTEMD_VERSION  systemd version to target [default: `systemctl --version`]; >= 253 uses
#                    Type=notify-reload (systemd sends SIGHUP itself), older Type=notify + ExecReload
#   VERIFY=0         skip `systemd-analyze verify`
#   CLUSTER          cluster layout for broker nodes [default: $CONFDIR/cluster.toml if present]:
#                    when given and $CONFDIR/credentials does not exist yet, replica credentials are
#                    generated there (`mqd broker-credentials`, one 0600 file per node) and a drop-in
#                    loads each node's file into mqd-broker@<node> (LoadCredential=replica:...)
#
# Afterwards: edit /etc/mqd/mqd.toml, then `systemctl enable --now mqd` (and mqd-spark or mqd-spark.timer,
# mqd-broker@<node-id> for broker nodes on this host, with /etc/mqd/broker-<node-id>.toml).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1

DESTDIR=${DESTDIR:-}
UNITDIR=${UNITDIR:-/etc/systemd/system}
CONFDIR=${CONFDIR:-/etc/mqd}
DOCDIR=${DOCDIR:-/usr/share/doc/mqd}
VERIFY=${VERIFY:-1}

MQD_BIN=${MQD_BIN:-}
if [ -z "$MQD_BIN" ]; then
    if [ -x "$root/.venv/bin/mqd" ]; then
        MQD_BIN="$root/.venv/bin/mqd"
    elif command -v mqd >/dev/null 2>&1; then
        MQD_BIN=$(command -v mqd)
    else
        echo "error: no mqd executable found; run 'make install' or set MQD_BIN" >&2
        exit 1
    fi
fi
case "$MQD_BIN" in
    /*) ;;
    *) echo "error: MQD_BIN must be an absolute path, got '$MQD_BIN'" >&2; exit 1 ;;
esac
case "$MQD_BIN" in
    /home/*|/root/*|/run/user/*)
        echo "warning: $MQD_BIN is hidden from the services by ProtectHome=yes; install mqd" \
             "system-wide (python3 -m venv /opt/mqd && /opt/mqd/bin/pip install '.[spark]') and set MQD_BIN" >&2 ;;
    /tmp/*|/var/tmp/*)
        echo "warning: $MQD_BIN is hidden from the services by PrivateTmp=yes" >&2 ;;
esac

if [ -z "${SYSTEMD_VERSION:-}" ]; then
    SYSTEMD_VERSION=$(systemctl --version 2>/dev/null | awk 'NR==1 {print $2}' | tr -cd '0-9')
fi
SYSTEMD_VERSION=${SYSTEMD_VERSION:-0}

run() {
    if [ "$dry" = 1 ]; then echo "would run: $*"; else "$@"; fi
}

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT INT TERM

units="mqd.service mqd-broker@.service mqd-spark.service mqd-spark-once.service mqd-spark.timer"
for unit in $units; do
    # Documentation= names the default DOCDIR; another DOCDIR replaces it
    sed -e "s|@MQD@|$MQD_BIN|g" -e "s|file:///usr/share/doc/mqd/|file://$DOCDIR/|g" "$here/$unit" > "$staging/$unit"
done
if [ "$SYSTEMD_VERSION" -ge 253 ]; then
    # systemd sends SIGHUP itself and waits for RELOADING=1 ... READY=1
    sed -i -e 's/^Type=notify$/Type=notify-reload/' -e '/^ExecReload=/d' "$staging/mqd.service"
fi
if [ "$SYSTEMD_VERSION" -lt 254 ]; then
    # a growing restart delay needs systemd >= 254; older systemd keeps the flat RestartSec
    sed -i -e '/^RestartSteps=/d' -e '/^RestartMaxDelaySec=/d' "$staging/mqd-spark.service"
fi

# The service's paths: state and landing under StateDirectory, pid file under RuntimeDirectory.
sed -e 's|^# state_dir = "state" |state_dir = "/var/lib/mqd"|' \
    -e 's|^# pid_file = "state/mqd.pid" |pid_file = "/run/mqd/mqd.pid"|' \
    -e 's|^# log_file = "state/mqd.log" |log_file = "/var/lib/mqd/mqd.log"|' \
    -e 's|^# dir = "landing" |dir = "/var/lib/mqd/landing"|' \
    -e 's|^# offset_file = "state/offsets.json" |offset_file = "/var/lib/mqd/offsets.json"|' \
    -e 's|^# output_dir = "warehouse/events" |output_dir = "/var/lib/mqd/warehouse/events"|' \
    -e 's|^# checkpoint_dir = "warehouse/_checkpoints/events"|checkpoint_dir = "/var/lib/mqd/warehouse/_checkpoints/events"|' \
    -e 's|^# quarantine_dir = "warehouse/_quarantine/events"|quarantine_dir = "/var/lib/mqd/warehouse/_quarantine/events"|' \
    "$root/config/mqd.toml" > "$staging/mqd.toml"
"$MQD_BIN" config check "$staging/mqd.toml" >/dev/null

if [ "$VERIFY" = 1 ] && command -v systemd-analyze >/dev/null 2>&1; then
    # a template is verified through an instance of it
    cp "$staging/mqd-broker@.service" "$staging/mqd-broker@verify.service"
    # verify exits 0 on "unknown key ... ignoring": any complaint about our files is an error
    if ! out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no \
            "$staging/mqd.service" "$staging/mqd-broker@verify.service" "$staging/mqd-spark.service" \
            "$staging/mqd-spark-once.service" "$staging/mqd-spark.timer" 2>&1) \
        || printf '%s\n' "$out" | grep -q "^$staging/"; then
        printf '%s\n' "$out" >&2
        echo "error: systemd-analyze verify failed" >&2
        exit 1
    fi
    [ -n "$out" ] && printf '%s\n' "$out" >&2
    rm -f "$staging/mqd-broker@verify.service"
    echo "units verified (systemd $SYSTEMD_VERSION)"
fi

run mkdir -p "$DESTDIR$UNITDIR" "$DESTDIR$CONFDIR"
for unit in $units; do
    run install -m 0644 "$staging/$unit" "$DESTDIR$UNITDIR/$unit"
done
# what the units' Documentation= names, with the repository's layout so relative links still work
docs="README.md systemd/README.md $(cd "$root" && find docs -type f ! -name '*.pyc' | sort)"
for doc in $docs; do
    run install -D -m 0644 "$root/$doc" "$DESTDIR$DOCDIR/$doc"
done
if [ -e "$DESTDIR$CONFDIR/mqd.toml" ]; then
    echo "keeping existing $DESTDIR$CONFDIR/mqd.toml"
else
    run install -m 0644 "$staging/mqd.toml" "$DESTDIR$CONFDIR/mqd.toml"
fi

# Replica credentials for the broker nodes of a cluster layout (issue 13): generated here, never
# shipped. Each node reads its own file through systemd credentials (the unit runs as a dynamic
# user that cannot read /etc/mqd/credentials itself): in its node file,
#   replica_credentials = "/run/credentials/mqd-broker@<node-id>.service/replica"
CLUSTER=${CLUSTER:-}
[ -z "$CLUSTER" ] && [ -e "$DESTDIR$CONFDIR/cluster.toml" ] && CLUSTER="$DESTDIR$CONFDIR/cluster.toml"
if [ -n "$CLUSTER" ]; then
    creds="$DESTDIR$CONFDIR/credentials"
    if [ -e "$creds" ]; then
        echo "keeping existing replica credentials in $creds"
    else
        run "$MQD_BIN" broker-credentials --cluster "$CLUSTER" --out-dir "$creds"
        run chmod 0700 "$creds"
        echo "copy each node's $creds/<node-id>.credentials.toml to that node only (same path)"
    fi
    dropin="$DESTDIR$UNITDIR/mqd-broker@.service.d"
    run mkdir -p "$dropin"
    if [ "$dry" = 1 ]; then
        echo "would write $dropin/credentials.conf"
    else
        printf '[Service]\nLoadCredential=replica:%s/credentials/%%i.credentials.toml\n' "$CONFDIR" \
            > "$dropin/credentials.conf"
        chmod 0644 "$dropin/credentials.conf"
    fi
fi

if [ -z "$DESTDIR" ] && [ "$dry" = 0 ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
echo "installed mqd units into $DESTDIR$UNITDIR (mqd: $MQD_BIN), documentation into $DESTDIR$DOCDIR"
echo "next: edit $CONFDIR/mqd.toml, then: systemctl enable --now mqd mqd-spark (or mqd mqd-spark.timer)"
