#!/bin/bash
# Probe of the sssd image: can the directory be reached, over TLS checked
# against the cluster's CA, and bound as sssd binds? Run by the entrypoint
# every PROBE_SECONDS; it writes its verdict where the pod's agent reads it
# (slurmk8s/slurm/directory.py), a file of three lines:
#
#   state=ok|unreachable|tls|bind|error
#   uri=<the URI that answered, or the first one tried>
#   message=<what failed, and what to check>
#
#   probe.sh SSSD_CONF PASSWORD_FILE OUT [GROUPS GROUPS_OUT]
#
# The password is read from the mounted Secret at each run, so a Secret changed
# to a wrong password shows here although sssd, which read it at its start,
# still binds with the old one.
#
# With GROUPS (a file of group names, one per line: the groups accounts follow),
# a bind that succeeded also reads those groups' memberUid from the directory, as
# sssd's rfc2307 schema does, and writes GROUPS_OUT, a line `name:member,...`
# per group found, for the agent. Not `getent group`: sssd lists a member who
# is not yet a user, then leaves them out once they are, until it reads the
# group again.
set -uo pipefail
conf=$1 password_file=$2 out=$3 groups_file=${4:-} groups_out=${5:-}

setting() { sed -n "s/^$1 = //p" "$conf" | head -n 1; }
uris=$(setting ldap_uri | tr -d ' ' | tr ',' ' ')
bind_dn=$(setting ldap_default_bind_dn)
start_tls=$(setting ldap_id_use_start_tls)
ca=$(setting ldap_tls_cacert)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bind=(-x)
if [ -n "$bind_dn" ]; then
  # ldapwhoami -y reads the whole file: the password without its newline.
  (umask 077 && head -n 1 "$password_file" | tr -d '\n' >"$work/password") 2>/dev/null
  bind+=(-D "$bind_dn" -y "$work/password")
fi
[ "$start_tls" = true ] && bind+=(-ZZ)

state="" message=() first=""
rank() { case $1 in ok) echo 4 ;; bind) echo 3 ;; tls) echo 2 ;; error) echo 1 ;; *) echo 0 ;; esac; }
verdict() {  # keeps the most telling state over the URIs: ok, then bind, tls, error, unreachable
  if [ -z "$state" ] || [ "$(rank "$1")" -gt "$(rank "$state")" ]; then state=$1 first=$2; fi
}
for uri in $uris; do
  rest=${uri#*://} scheme=${uri%%://*}
  hostport=${rest%%/*}
  host=${hostport%:*} port=${hostport##*:}
  [ "$host" = "$hostport" ] && { [ "$scheme" = ldaps ] && port=636 || port=389; }
  # shellcheck disable=SC2016 # expanded by the inner bash, from its arguments
  if ! timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" 2>/dev/null; then
    verdict unreachable "$uri"
    message+=("$uri: no connection to $host:$port within 5 s")
    continue
  fi
  said=$(LDAPTLS_CACERT=${ca:-/etc/ssl/certs/ca-certificates.crt} LDAPTLS_REQCERT=demand \
    timeout 15 ldapwhoami -H "$uri" -o nettimeout=5 "${bind[@]}" 2>&1)
  rc=$?
  said=$(printf '%s' "$said" | tr '\n\t' '  ' | tr -s ' ' | cut -c 1-200)
  case $rc in
    0) verdict ok "$uri"; message=("$uri: bound as ${bind_dn:-anonymous}"); break ;;
    49) verdict bind "$uri"
        message+=("$uri: the directory refused the bind as $bind_dn ($said): check the password in the Secret spec.identity.ldap.bindPasswordSecret names") ;;
    255|245|1) verdict tls "$uri"
        message+=("$uri: $host:$port answers but TLS failed ($said): check spec.identity.ldap.ca and that the server's certificate names $host") ;;
    *) verdict error "$uri"; message+=("$uri: ldapwhoami exited $rc ($said)") ;;
  esac
done
[ -n "$state" ] || { state=error; message=("no URI in $conf"); }

# The followed groups' members, from the URI that answered: `name:member,...` per group.
# A value with ',' would read as two members: its ',' become ' ', which no user name holds,
# and the agent leaves it out (slurmk8s/slurm/directory.py). A base64 value (LDIF's form for
# a value no user name is) is marked so. A group whose members came in parts
# (memberUid;range=..., Active Directory's answer for a long list) is left out: the agent
# reads it as unknown and closes nobody in its account.
# shellcheck disable=SC2016 # an awk program: its $0 and $1 are awk's
members_awk='
/^cn: / { if (cn == "") cn = substr($0, 5) }
/^memberUid: / { v = substr($0, 12); gsub(/,/, " ", v); m = m (m ? "," : "") v }
/^memberUid:: / { m = m (m ? "," : "") "<base64 value>" }
/^memberUid;/ { partial = 1 }
/^$/ { if (cn != "" && !partial) print cn ":" m; cn = ""; m = ""; partial = 0 }
END { if (cn != "" && !partial) print cn ":" m }'
if [ "$state" = ok ] && [ -n "$groups_out" ] && [ -s "$groups_file" ]; then
  base_filter=$(setting ldap_group_search_base)
  base=${base_filter%%\?*} extra=""
  case $base_filter in *\?subtree\?*) extra=${base_filter#*\?subtree\?} ;; esac
  any=""
  # Names the operator checked (POSIX group names: no LDAP filter character).
  while read -r group; do [[ $group =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] && any+="(cn=$group)"; done <"$groups_file"
  if [ -n "$any" ]; then
    tmp=$(mktemp "$groups_out.XXXXXX")
    if LDAPTLS_CACERT=${ca:-/etc/ssl/certs/ca-certificates.crt} LDAPTLS_REQCERT=demand \
        timeout 15 ldapsearch -LLL -o ldif-wrap=no -o nettimeout=5 -H "$first" "${bind[@]}" -b "$base" \
        "(&(objectClass=posixGroup)(|$any)$extra)" cn memberUid 2>/dev/null |
        awk "$members_awk" >"$tmp"; then
      chmod 0644 "$tmp"
      mv -f "$tmp" "$groups_out"
    else
      rm -f "$tmp"  # the agent sees the list age, and closes nothing while it is old
    fi
  fi
fi
joined=$(IFS=';'; printf '%s' "${message[*]}" | sed 's/;/; /g')
tmp=$(mktemp "$out.XXXXXX")
printf 'state=%s\nuri=%s\nmessage=%s\n' "$state" "$first" "$joined" >"$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$out"
