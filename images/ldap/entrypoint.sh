#!/bin/bash
# Entrypoint of the slurmk8s ldap image (/usr/local/bin/slurmk8s-entrypoint).
#
#   slurmk8s-entrypoint          write slapd's configuration, make the directory's
#                                top entries the first time, run slapd in the foreground
#   slurmk8s-entrypoint ready    exit 0 when slapd answers on ldap://127.0.0.1
#
# Environment:
#   LDAP_SUFFIX      the directory's top, e.g. dc=example,dc=org (required)
# Mounts:
#   /run/slurmk8s/ldap/tls/tls.crt, tls.key   its certificate (a kubernetes.io/tls Secret)
#   /run/slurmk8s/ldap/admin/password         the password of cn=admin,<suffix> (a Secret)
#   /run/slurmk8s/ldap/seed/*.ldif            optional: entries loaded, in name order, when
#                                             the directory is made (a Secret: they may hold
#                                             passwords), as a directory a site already has
# The data is in /var/lib/ldap (a volume to keep it). Users, groups and the
# account SSSD binds as are added with ldapadd as cn=admin; authenticated
# binds may read everything but passwords, anonymous ones nothing.
set -euo pipefail
SK_COMPONENT=ldap
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
lib=$here/../common/slurmk8s-lib.sh
[ -r "$lib" ] || lib=/usr/local/lib/slurmk8s/lib.sh
# shellcheck source=images/common/slurmk8s-lib.sh
. "$lib"

if [ "${1:-}" = ready ]; then
  sk_quick ldapsearch -x -H ldap://127.0.0.1 -b "" -s base -LLL namingContexts >/dev/null 2>&1 \
    || { echo "slapd does not answer on ldap://127.0.0.1" >&2; exit 1; }
  exit 0
fi

sk_is_root || sk_die "the ldap entrypoint must run as root (slapd binds ports 389 and 636, then runs as openldap)"
sk_require_env LDAP_SUFFIX
[[ $LDAP_SUFFIX =~ ^[a-z]+=[A-Za-z0-9-]+(,[a-z]+=[A-Za-z0-9-]+)*$ ]] \
  || sk_die "LDAP_SUFFIX=$LDAP_SUFFIX is not a DN of attribute=value parts such as dc=example,dc=org"
tls=/run/slurmk8s/ldap/tls
admin_file=/run/slurmk8s/ldap/admin/password
for f in "$tls/tls.crt" "$tls/tls.key" "$admin_file"; do
  [ -r "$f" ] || sk_die "$f is missing: mount the certificate Secret at $tls and the admin password at ${admin_file%/*}"
done

run=/run/slapd
install -d -m 0750 -o openldap -g openldap "$run" /var/lib/ldap
install -m 0640 -o root -g openldap "$tls/tls.crt" "$run/tls.crt"
install -m 0640 -o root -g openldap "$tls/tls.key" "$run/tls.key"
# slappasswd -T takes the whole file, a final newline too: hash the first line only.
head -n 1 "$admin_file" | tr -d '\n' >"$run/.admin-password"
rootpw=$(slappasswd -T "$run/.admin-password" -h '{SSHA}')
rm -f "$run/.admin-password"
umask 027
cat >"$run/slapd.conf" <<CONF
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/nis.schema
include /etc/ldap/schema/inetorgperson.schema
include /etc/ldap/schema/openssh-lpk.schema
pidfile $run/slapd.pid
argsfile $run/slapd.args
modulepath /usr/lib/ldap
moduleload back_mdb
TLSCertificateFile $run/tls.crt
TLSCertificateKeyFile $run/tls.key
access to dn.base="" by * read
access to dn.base="cn=Subschema" by * read
access to attrs=userPassword by self write by anonymous auth by * none
access to * by users read by * none
database mdb
maxsize 268435456
suffix "$LDAP_SUFFIX"
rootdn "cn=admin,$LDAP_SUFFIX"
rootpw $rootpw
directory /var/lib/ldap
index objectClass eq
index uid,cn,memberUid eq
index uidNumber,gidNumber eq
CONF
chgrp openldap "$run/slapd.conf"

if [ -z "$(ls -A /var/lib/ldap)" ]; then
  top=${LDAP_SUFFIX%%,*}
  slapadd -f "$run/slapd.conf" <<LDIF
dn: $LDAP_SUFFIX
objectClass: dcObject
objectClass: organization
o: slurmk8s
dc: ${top#dc=}

dn: ou=people,$LDAP_SUFFIX
objectClass: organizationalUnit
ou: people

dn: ou=groups,$LDAP_SUFFIX
objectClass: organizationalUnit
ou: groups
LDIF
  for seed in /run/slurmk8s/ldap/seed/*.ldif; do
    [ -e "$seed" ] || continue
    slapadd -f "$run/slapd.conf" -l "$seed" || sk_die "could not load $seed (see above)"
    sk_log "loaded $(grep -c '^dn:' "$seed") entries of ${seed##*/}"
  done
  chown -R openldap:openldap /var/lib/ldap
  sk_log "made $LDAP_SUFFIX with ou=people and ou=groups"
fi
sk_log "serving $LDAP_SUFFIX on ldaps:/// and ldap:/// (StartTLS)"
exec slapd -d stats -h "ldap:/// ldaps:///" -u openldap -g openldap -f "$run/slapd.conf"
