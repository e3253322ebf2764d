#!/bin/sh
# Image builds never start services (Debian policy-rc.d convention).
exit 101
