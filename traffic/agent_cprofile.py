"""Agents under cProfile: `python -m traffic.agent_cprofile PROFILE_OUT CONFIG.json...`.

Runs traffic.host's main unchanged, with the profiler on only while `Host.run` runs
(the workload and the linger, not start-up), timed in the process's CPU seconds (a
select() that waits costs nothing), and writes the pstats file to PROFILE_OUT.
traffic.launch starts it in place of `python -m traffic.host` for the process that
serves a node named in `CPROFILE_AGENTS` (scripts/profile_packet.py). cProfile slows
the process down several times: its run is not the one to time.
"""

from __future__ import annotations

import cProfile
import sys
import time

from traffic import host


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: python -m traffic.agent_cprofile PROFILE_OUT CONFIG.json...",
              file=sys.stderr)
        return 2
    out, *configs = argv
    prof = cProfile.Profile(time.process_time)   # CPU time: select and sleep cost ~0
    run = host.Host.run

    def profiled(self) -> None:
        prof.enable()
        try:
            run(self)
        finally:
            prof.disable()

    host.Host.run = profiled
    try:
        return host.main(configs)
    finally:
        prof.dump_stats(out)


if __name__ == "__main__":
    sys.exit(main())
