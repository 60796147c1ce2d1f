#!/bin/bash
# Installs SSSD's client packages (libnss-sss: glibc's `sss` module, which
# its postinst adds to /etc/nsswitch.conf) from the Debian suite whose SSSD
# the cluster's sssd image runs, so that client and daemon are one version.
# Run by the Dockerfiles (RUN), as root:
#
#   install-sss-client.sh PACKAGE...
#
# Build argument, in the environment:
#   SSS_SUITE   that suite (slurmk8s/versions.py, Release.sssd_suite). When it
#               is not this image's own (forky has no SSSD: trixie's), it is
#               added for these packages alone: pinned below every other
#               suite, and removed again afterwards.
set -euo pipefail

log() { printf 'install-sss-client: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SSS_SUITE=${SSS_SUITE:-}
[ $# -gt 0 ] || die "name the packages to install"
own=$(sed -n "s/^VERSION_CODENAME=//p" /etc/os-release)
if [ -z "$SSS_SUITE" ] || [ "$SSS_SUITE" = "$own" ]; then
  exec /usr/local/lib/slurmk8s/install-packages.sh "$@"
fi
[[ $SSS_SUITE =~ ^[a-z]+$ ]] || die "SSS_SUITE=$SSS_SUITE is not a Debian suite name"
mirror=$({ grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list || true; } | awk '{ print $2; exit }')
[ -n "$mirror" ] || die "no deb line in /etc/apt/sources.list*: cannot tell the archive to take $SSS_SUITE from"
export DEBIAN_FRONTEND=noninteractive
list=/etc/apt/sources.list.d/slurmk8s-sss.list
pin=/etc/apt/preferences.d/slurmk8s-sss
echo "deb $mirror $SSS_SUITE main" >"$list"
printf 'Package: *\nPin: release n=%s\nPin-Priority: 1\n' "$SSS_SUITE" >"$pin"
log "installing $* from $SSS_SUITE ($mirror) on $own"
apt-get update
apt-get install -y --no-install-recommends "${@/%//$SSS_SUITE}"
rm -f "$list" "$pin"
apt-get clean
rm -rf /var/lib/apt/lists/*
