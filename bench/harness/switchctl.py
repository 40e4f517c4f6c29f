"""switchctl.py: what the scenarios ask a running switchd through its
admin socket (the switchctl beside their switchd): its counters, and
waiting until its jobs are active. A switchd that does not answer reads as
no counters ("{}"), so a snapshot taken while it stops does not fail a run.
"""

import json
import subprocess
import time

from lifecycle import HarnessError


class Switchctl:
    def __init__(self, binary, socket):
        self.binary, self.socket = str(binary), str(socket)

    def stats_text(self):
        """`switchctl stats --json`'s text, or "{}" when switchd does not answer."""
        r = subprocess.run([self.binary, "--socket", self.socket, "stats", "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        return r.stdout if r.returncode == 0 and r.stdout.strip() else "{}\n"

    def active_jobs(self):
        """The ids of the jobs with every rank joined."""
        try:
            jobs = json.loads(self.stats_text()).get("jobs") or []
        except ValueError:
            return set()
        return {j.get("id") for j in jobs if j.get("state") == "active"}

    def wait_active(self, ids, timeout, what):
        """Until every job of ids is active; HarnessError after timeout s."""
        deadline = time.monotonic() + timeout
        while not set(ids) <= self.active_jobs():
            if time.monotonic() >= deadline:
                raise HarnessError(f"{what}: job(s) {sorted(ids)} not active at the switch within {timeout} s")
            time.sleep(0.1)
