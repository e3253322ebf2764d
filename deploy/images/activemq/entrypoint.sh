#!/bin/bash
# Write the instance (activemq.xml with the credentials, log4j2.properties, lib/ with the JSON jars) into the
# volume /var/lib/nsjms-activemq and run the broker in the foreground as the activemq OS user.
set -euo pipefail
shopt -u patsub_replacement 2>/dev/null || true  # bash 5.2: "&" in ${x//p/r} must stay literal
BASE=/var/lib/nsjms-activemq
TEMPLATES=/usr/share/nsjms-activemq
HOME_DIR=/usr/share/activemq

xml_escape() {
    local v="$1"
    v="${v//&/&amp;}"; v="${v//</&lt;}"; v="${v//>/&gt;}"; v="${v//\"/&quot;}"; v="${v//\'/&apos;}"
    printf '%s' "$v"
}

if [ -n "${ACTIVEMQ_LOGIN:-}" ] && [ -n "${ACTIVEMQ_PASSCODE:-}" ]; then
    xml="$(<"$TEMPLATES/activemq-auth.xml")"
    login="$(xml_escape "$ACTIVEMQ_LOGIN")"
    passcode="$(xml_escape "$ACTIVEMQ_PASSCODE")"
    xml="${xml//@AMQ_LOGIN@/$login}"
    xml="${xml//@AMQ_PASSCODE@/$passcode}"
elif [ "${ACTIVEMQ_ANONYMOUS:-}" = "1" ]; then
    xml="$(<"$TEMPLATES/activemq-anonymous.xml")"
else
    echo "nsjms-activemq: set ACTIVEMQ_LOGIN and ACTIVEMQ_PASSCODE (or ACTIVEMQ_ANONYMOUS=1 for tests)" >&2
    exit 2
fi
unset ACTIVEMQ_PASSCODE

umask 0077
mkdir -p "$BASE/data" "$BASE/tmp" "$BASE/lib"
printf '%s\n' "$xml" >"$BASE/activemq.xml"
cp /etc/activemq/instances-available/main/log4j2.properties "$BASE/log4j2.properties"
for jar in jettison.jar xstream.jar xpp3.jar xmlpull.jar mxparser.jar; do
    [ -e "/usr/share/java/$jar" ] && ln -sfn "/usr/share/java/$jar" "$BASE/lib/$jar"
done
chown -R activemq:activemq "$BASE"

# shellcheck disable=SC2086  # ACTIVEMQ_JAVA_OPTS is a list of options
exec setpriv --reuid=activemq --regid=activemq --init-groups -- java ${ACTIVEMQ_JAVA_OPTS:--Xms256M -Xmx512M} \
    "-Dactivemq.home=$HOME_DIR" "-Dactivemq.base=$BASE" "-Dactivemq.conf=$BASE" "-Dactivemq.data=$BASE/data" \
    "-Djava.io.tmpdir=$BASE/tmp" --add-opens java.base/java.lang=ALL-UNNAMED \
    -jar "$HOME_DIR/bin/activemq.jar" start "xbean:file:$BASE/activemq.xml"
