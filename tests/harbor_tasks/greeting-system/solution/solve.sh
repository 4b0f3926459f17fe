#!/bin/bash
set -e
name=$(cat /app/name.txt)
echo "Hello, $name!" > /app/answer.txt
site=$(/usr/bin/python3 -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$site" && cp -r /opt/vendor/greeting "$site/"
echo "name=$name" > /etc/greeting.conf
