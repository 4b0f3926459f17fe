#!/bin/bash
set -e
name=$(cat /app/name.txt)
echo "$GREETING, $name!" > /app/answer.txt  # GREETING: [solution] env
site=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$site" && cp -r /opt/vendor/greeting "$site/"
echo "name=$name" > /etc/greeting.conf
