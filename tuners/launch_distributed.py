"""Run any KerasTuner search command as a chief and W workers on this machine (gRPC on 127.0.0.1).

    python tuners/launch_distributed.py --workers 2 -- python tuners/blundell_prior_grid.py --epochs 3

The chief (KERASTUNER_TUNER_ID=chief) starts first and serves the oracle on
KERASTUNER_ORACLE_IP:KERASTUNER_ORACLE_PORT; once its port is open the workers
(tuner0, tuner1, ...) start and train. The command must build the same tuner in
every process and call ``search``: the chief's call returns when every trial has
ended, so the chief prints the results. Workers' output goes to
``<log-dir>/worker-tuner<k>.log``. Pass ``--overwrite`` inside the command only if
you mean to start over: tfbnn tuners ignore it on workers (only the chief may wipe
the project folder).

``tfbnn tune --workers W`` does the same for the tfbnn searches.
"""

import argparse
import sys

from tfbnn import tuning


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="number of worker processes (>= 1)")
    parser.add_argument("--host", default="127.0.0.1", help="the chief's address")
    parser.add_argument("--port", type=int, default=None, help="the chief's port (default: a free one)")
    parser.add_argument("--log-dir", default=None, help="folder for the workers' output (default: discarded)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the search command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the search command after --")
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    sys.exit(tuning.launch_distributed(command, args.workers, host=args.host, port=args.port, log_dir=args.log_dir))


if __name__ == "__main__":
    main()
