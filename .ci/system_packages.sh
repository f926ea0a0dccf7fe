#!/usr/bin/env bash
# Debian packages of the real components that system tests run (tests/system/test_slurm.py: a one-node Slurm
# with munge; tests/system/test_browser.py: headless Chromium and its chromedriver against the Dagster UI;
# tests/system/test_postgres_storage.py: a PostgreSQL server as Dagster's instance storage).
# Idempotent: installs only what is missing. Needs root (CI) or sudo.
set -euo pipefail
packages=(slurmctld slurmd slurm-client munge chromium chromium-driver postgresql)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
echo "installing Debian packages: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The packages enable their services for systemd; the tests start their own daemons on loopback instead.
