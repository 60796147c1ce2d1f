#!/bin/bash
# Installs an image's Slurm packages and other Debian packages, then cleans up.
# Run by the Dockerfiles (RUN), as root, during the build:
#
#   install-packages.sh [PACKAGE...]
#
# Build arguments, passed in the environment:
#   SLURM_SOURCE    where the Slurm packages come from:
#                     debian  the base image's own archive (Debian bookworm:
#                             Slurm 22.05); the default
#                     apt     an extra apt repository, SLURM_APT_LINE
#   SLURM_APT_LINE  one sources.list line for SLURM_SOURCE=apt, e.g.
#                     deb [signed-by=/usr/share/keyrings/slurm.gpg] https://repo.example.org/slurm bookworm main
#                   (signed-by names a key file from images/common/keyrings/,
#                   which is copied to /usr/share/keyrings/ first), or with
#                   [trusted=yes] for a repository you trust without a key
#   SLURM_PACKAGES  the Slurm packages (Debian names by default; a repository
#                   built from SchedMD's debian/ packaging names them
#                   slurm-smd-slurmd, slurm-smd-client, ...)
#   SLURM_VERSION   optional: install exactly this version of SLURM_PACKAGES
#                   (apt's package=version); the build fails, naming it, when
#                   the archive does not have it. The sandbox's builds pass
#                   the version table's (slurmk8s/versions.py)
# PACKAGE arguments (munge, openssh-server, ...) always come from the base
# image's archive and are not pinned: Debian's security updates replace
# their versions, so a pin would break rebuilds.
set -euo pipefail

log() { printf 'install-packages: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SLURM_SOURCE=${SLURM_SOURCE:-debian}
SLURM_APT_LINE=${SLURM_APT_LINE:-}
SLURM_PACKAGES=${SLURM_PACKAGES:-}
SLURM_VERSION=${SLURM_VERSION:-}
export DEBIAN_FRONTEND=noninteractive

case $SLURM_SOURCE in
  debian)
    [ -z "$SLURM_APT_LINE" ] || die "SLURM_APT_LINE is set but SLURM_SOURCE=debian: pass --build-arg SLURM_SOURCE=apt to use that repository"
    ;;
  apt)
    [ -n "$SLURM_APT_LINE" ] || die "SLURM_SOURCE=apt needs SLURM_APT_LINE (a sources.list line for the repository with the Slurm packages)"
    if [ -d /tmp/slurmk8s-keyrings ]; then
      find /tmp/slurmk8s-keyrings -maxdepth 1 -type f \( -name '*.gpg' -o -name '*.asc' \) \
        -exec install -m 0644 -t /usr/share/keyrings/ {} +
    fi
    # apt verifies https repositories against ca-certificates, which slim
    # Debian images lack ("The certificate issuer is unknown"): install it
    # from the base's archive before adding the repository.
    case $SLURM_APT_LINE in
      *https://*)
        if [ ! -s /etc/ssl/certs/ca-certificates.crt ]; then
          log "installing ca-certificates for the https repository"
          apt-get update
          apt-get install -y --no-install-recommends ca-certificates
        fi
        ;;
    esac
    printf '%s\n' "$SLURM_APT_LINE" >/etc/apt/sources.list.d/slurm.list
    log "Slurm packages from: $SLURM_APT_LINE"
    ;;
  *)
    die "unknown SLURM_SOURCE '$SLURM_SOURCE' (use debian or apt)"
    ;;
esac
rm -rf /tmp/slurmk8s-keyrings

packages=()
for p in $SLURM_PACKAGES; do
  packages+=("$p${SLURM_VERSION:+=$SLURM_VERSION}")
done
packages+=("$@")
[ ${#packages[@]} -gt 0 ] || die "nothing to install"

# Package scripts must not try to start services in an image build.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 0755 "$policy"
  own_policy=1
fi

apt-get update
# A pinned Slurm that the archive no longer has must fail the build, naming
# it: apt would say only "Version ... was not found".
if [ -n "$SLURM_VERSION" ]; then
  for p in $SLURM_PACKAGES; do
    if ! apt-cache show "$p=$SLURM_VERSION" >/dev/null 2>&1; then
      have=$(apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: //p')
      die "Slurm package $p $SLURM_VERSION is not in the archive this build reads (it has ${have:-no $p}): the image would carry another Slurm than its tag says. Build from an archive that has that version (a snapshot of the suite, or SLURM_SOURCE=apt), or change the pin (slurm_package_version in slurmk8s/versions.py)"
    fi
  done
fi
log "installing: ${packages[*]}"
apt-get install -y --no-install-recommends "${packages[@]}"
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
[ "$own_policy" = 0 ] || rm -f "$policy"

# Debian's mpi/pmix plugin dlopens <multiarch>/pmix2/lib/libpmix.so, a name
# only libpmix-dev (with headers and their dependencies, ~100 MB) provides:
# link it to the runtime library instead.
for lib in /usr/lib/*/pmix2/lib/libpmix.so.2; do
  if [ -e "$lib" ] && [ ! -e "${lib%.2}" ]; then
    ln -s libpmix.so.2 "${lib%.2}"
    log "linked ${lib%.2} for mpi/pmix"
  fi
done

# Every cluster brings its own munge key (a Secret); never ship one.
rm -f /etc/munge/munge.key
# Debian's ssh host keys would be the same in every container of this image;
# the login entrypoint uses the cluster's key instead.
rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub

# Name what was installed in the build log.
for p in $SLURM_PACKAGES; do
  # shellcheck disable=SC2016 # ${Package} is dpkg-query's field, not shell
  dpkg-query -W -f 'install-packages: installed ${Package} ${Version}\n' "$p" >&2
done
