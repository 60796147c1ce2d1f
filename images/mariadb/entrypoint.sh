#!/bin/bash
# Entrypoint of the slurmk8s mariadb image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint [MARIADBD_ARGS...]   create the data directory on first
#                                            start, then run mariadbd in the
#                                            foreground with the database and
#                                            user slurmdbd needs
#   slurmk8s-entrypoint ready                exit 0 when the server answers
#
# Needs: the data volume at /var/lib/mysql, /run/slurmk8s/db/password (the
# <cluster>-db-password Secret). SLURMK8S_DB_NAME and SLURMK8S_DB_USER name the
# database and user (default slurm_acct_db and slurm), and
# SLURMK8S_DB_BUFFER_POOL_MIB InnoDB's buffer pool (default 256; the operator
# gives half the container's memory limit). Every start sets the user's
# password from the Secret, so a restored volume takes the cluster's.
set -euo pipefail
SK_COMPONENT=mariadb
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

datadir=/var/lib/mysql
socket=/run/mysqld/mysqld.sock
password_file=$SK_MOUNTS/db/password
db=${SLURMK8S_DB_NAME:-slurm_acct_db}
user=${SLURMK8S_DB_USER:-slurm}
pool=${SLURMK8S_DB_BUFFER_POOL_MIB:-256}

if [ "${1:-}" = ready ]; then
  sk_quick mariadb-admin --socket="$socket" --silent ping >/dev/null && exit 0
  echo "mariadbd does not answer on $socket" >&2
  exit 1
fi

sk_is_root || sk_die "mariadb's entrypoint must start as root (it prepares the data volume; mariadbd runs as mysql)"
[ -r "$password_file" ] || sk_die "$password_file is missing: mount the <cluster>-db-password Secret at $(dirname "$password_file")"
[[ $db =~ ^[A-Za-z0-9_]{1,64}$ ]] || sk_die "SLURMK8S_DB_NAME=$db: use letters, digits and '_'"
[[ $user =~ ^[A-Za-z0-9_]{1,32}$ ]] || sk_die "SLURMK8S_DB_USER=$user: use letters, digits and '_'"
[[ $pool =~ ^[1-9][0-9]{0,6}$ ]] || sk_die "SLURMK8S_DB_BUFFER_POOL_MIB=$pool: a whole number of MiB"
password=$(head -n1 "$password_file")
[[ $password =~ ^[A-Za-z0-9._~+/=-]{8,256}$ ]] || sk_die "the password in $password_file must be 8 to 256 letters, digits or ._~+/=-"

install -d -o mysql -g mysql -m 0755 /run/mysqld
# Debian gives the mysql user whatever uid is free when the package is installed, so
# another release's image (a Slurm upgrade) may find the files owned by another uid.
owner=$(stat -c %u "$datadir/mysql" 2>/dev/null || id -u mysql)
if [ "$owner" != "$(id -u mysql)" ]; then
  sk_log "the database files belong to uid $owner, not mysql ($(id -u mysql)): giving them to mysql"
  chown -R --no-dereference mysql:mysql "$datadir"
fi
chown mysql:mysql "$datadir"
chmod 0750 "$datadir"
if [ ! -d "$datadir/mysql" ]; then
  sk_log "creating the database files in $datadir (first start)"
  mariadb-install-db --user=mysql --datadir="$datadir" --auth-root-authentication-method=socket \
    --skip-test-db >/dev/null
else
  sk_log "using the database files in $datadir ($(du -sh "$datadir" | cut -f1))"
fi

# Run at every start: the database, the user, its password and its grants.
init=/run/mysqld/slurmk8s-init.sql
install -o mysql -g mysql -m 0600 /dev/null "$init"
cat >"$init" <<SQL
CREATE DATABASE IF NOT EXISTS \`$db\`;
CREATE USER IF NOT EXISTS '$user'@'%' IDENTIFIED BY '$password';
ALTER USER '$user'@'%' IDENTIFIED BY '$password';
GRANT ALL PRIVILEGES ON \`$db\`.* TO '$user'@'%';
SQL
unset password

sk_run mariadbd --user=mysql --datadir="$datadir" --socket="$socket" --pid-file=/run/mysqld/mysqld.pid --bind-address=0.0.0.0 \
  --port=3306 --init-file="$init" --innodb-buffer-pool-size="${pool}M" "$@"
