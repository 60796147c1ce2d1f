#!/bin/bash
# The sssd container's answer to the login pod's sshd (images/login/authorized-keys.sh),
# one per connection to the socket /var/lib/sss/pipes/private/slurmk8s-keys (root's,
# under sssd's private directory): reads a user name on a line, writes that user's
# OpenSSH public keys from the directory (sss_ssh_authorizedkeys, answered from SSSD's
# cache while the directory is down). Nothing for a name that is not a user name, nor
# for one sssd.conf's filter_users names (the images' accounts and spec.login.users,
# which are the pods' own and never the directory's: SSSD's ssh responder does not
# apply that filter itself).
set -uo pipefail
LC_ALL=C
conf=${SSSD_CONF:-/etc/sssd/sssd.conf}
IFS= read -r -t 5 user || exit 0
[[ $user =~ ^[a-z_][a-z0-9_-]{0,31}$ ]] || exit 0
filtered=$(sed -n 's/^filter_users = //p' "$conf" 2>/dev/null | head -n 1)
[ -n "$filtered" ] || exit 0  # no sssd.conf as the operator renders it: answer nobody
case ", $filtered," in *", $user,"*) exit 0 ;; esac
exec timeout 10 sss_ssh_authorizedkeys "$user" 2>/dev/null
