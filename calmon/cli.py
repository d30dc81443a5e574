"""calmon: an online calibration monitor for ML classifiers (Kafka in, Prometheus out).

Start with `calmon demo`, then point `calmon run` at your own topics. Every
subcommand takes -h for its options and an example."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from calmon import config as config_mod
from calmon import secrets
from calmon.engine.series import ALL
from calmon.errors import CalmonError, ConfigError, StateError

if TYPE_CHECKING:
    from calmon.periods import PeriodRow

EXIT_CONFIG = 2


def _load_config(path: str | None) -> config_mod.Config:
    return config_mod.load(path)


def package_version() -> str:
    try:
        return version("calmon")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from calmon import __version__

        return __version__


def setup_logging(cfg: config_mod.LoggingConfig | None = None) -> None:
    from calmon import logs

    logs.setup(cfg or config_mod.LoggingConfig())


def cmd_run(args: argparse.Namespace) -> int:
    from calmon.daemon import Daemon

    cfg = _load_config(args.config)
    setup_logging(cfg.logging)
    secrets.register_config(config_mod.to_dict(cfg))  # masked in every log line
    return Daemon(cfg, rescale=args.rescale).run()


def cmd_demo(args: argparse.Namespace) -> int:
    from calmon.demo.run import run_demo

    return run_demo(args.duration, args.rate, args.port)


def cmd_check_config(args: argparse.Namespace) -> int:
    from calmon.io import webconfig

    cfg = _load_config(args.config)
    webconfig.load(cfg.server.web_config_file)  # its problems are config errors too
    # passwords, tokens and URL credentials masked (``${KAFKA_PASSWORD}`` is expanded by now)
    sys.stdout.write(yaml.safe_dump(secrets.mask_config(config_mod.to_dict(cfg)),
                                    sort_keys=False, default_flow_style=None))
    rc = cfg.recalibration
    if rc.enabled and rc.min_samples > rc.buffer:  # a refit could never start
        print(f"warning: recalibration.min_samples ({rc.min_samples}) cannot fit in "
              f"recalibration.buffer ({rc.buffer}): no refit will ever run", file=sys.stderr)
    if not getattr(args, "probe", False):
        _print_worst_case(cfg)
        return 0
    from calmon.io.probe import probe

    report = probe(cfg, timeout_s=args.probe_timeout)
    _print_worst_case(cfg, report.partitions)  # group mode: an instance may own them all
    # as YAML comments after the config, so stdout stays one valid YAML document
    sys.stdout.write("# probe:\n" + "".join(f"# {line}\n" for line in report.lines))
    return 1 if report.failed else 0


def _print_worst_case(cfg: config_mod.Config, partitions: int | None = None) -> None:
    """The worst case as YAML comments (stdout stays the effective config); a warning
    on stderr when it is over limits.memory, else the cgroup's limit."""
    from calmon import capacity

    budget = cfg.limits.memory if cfg.limits.memory is not None else capacity.cgroup_limit()
    lines, warning = capacity.report(cfg, budget, partitions)
    sys.stdout.write("\n".join(lines) + "\n")
    if warning is not None:
        where = "limits.memory" if cfg.limits.memory is not None else "the cgroup memory limit"
        print(f"calmon: {warning} ({where})", file=sys.stderr)


def _every(text: str | None) -> tuple[str, float] | None:
    """``--every``: (as given, seconds), a minute to a year like a window. Raises
    ConfigError."""
    if text is None:
        return None
    from calmon.config.units import MINUTE, YEAR, parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise ConfigError([f"--every: {e}"]) from None
    if not MINUTE <= seconds <= YEAR:
        raise ConfigError([f"--every: must be between 1m and 365d, got {text!r}"])
    return text.strip(), seconds


def cmd_replay(args: argparse.Namespace) -> int:
    from calmon import hints, replay

    cfg = _load_config(args.config)
    every_of = _every(args.every)
    for p in (args.predictions, args.labels):
        if not Path(p).is_file():
            print(f"calmon replay: no such file: {p}", file=sys.stderr)
            return EXIT_CONFIG
    if args.output_dir is not None and not args.recalibrate:
        print("calmon replay: --output-dir needs --recalibrate", file=sys.stderr)
        return EXIT_CONFIG
    invalid: Counter[tuple[str, str]] = Counter()
    bt = None
    periods: list[PeriodRow] = []
    every = None if every_of is None else replay.Every(*every_of, periods.append)
    if args.recalibrate:
        bt = replay.replay_recalibrate(cfg, Path(args.predictions), Path(args.labels),
                                       None if args.output_dir is None else Path(args.output_dir),
                                       invalid=invalid, every=every)
        view, engine = bt.view, bt.engine
    else:
        engine = replay.run(cfg, Path(args.predictions), Path(args.labels), invalid=invalid,
                            every=every)
        view = replay.final(engine)
    if args.json:
        out = (replay.to_json(view, cfg.metrics.classwise, bt) if every is None
               else replay.periods_json(periods, view, bt))
        out["invalid_reasons"] = replay.invalid_reasons(invalid)
        json.dump(out, sys.stdout, allow_nan=False)
        sys.stdout.write("\n")
    else:
        if every is None:
            replay.print_table(view, sys.stdout)
        else:
            replay.print_periods(sorted(periods, key=lambda p: (p.row.model, p.row.segment,
                                                                p.start)),
                                 view.counters, sys.stdout)
        if bt is not None:
            replay.print_events(bt.events, sys.stdout)
    # the reasons go to stderr (stdout stays the table or the one JSON object)
    for line in hints.summary(cfg, invalid):
        print(f"calmon replay: {line}", file=sys.stderr)
    if args.html and engine is not None:
        from calmon.report import write_report

        write_report(cfg, engine, Path(args.html), None if bt is None else bt.calibrators,
                     events=None if bt is None else bt.events,
                     title=f"calmon replay of {Path(args.predictions).name}", snapshot=view,
                     periods=periods if every is not None else None)
        print(f"calmon replay: report written to {args.html}", file=sys.stderr)
    empty = [(path, topic) for path, topic, key in
             ((args.predictions, "predictions", "predictions"), (args.labels, "labels", "labels"))
             if view.counters.get(key, 0) == 0]
    for path, topic in empty:
        print(f"calmon replay: {path} holds no valid {topic[:-1]} record"
              + (" (see the reasons above)" if any(t == topic for t, _ in invalid) else ""),
              file=sys.stderr)
    return 1 if empty else 0


def cmd_calibrators_list(args: argparse.Namespace) -> int:
    from calmon.recal.registry import Registry

    cfg = _load_config(args.config)
    from calmon.cluster import admin

    # a broken or forged file is reported in its row (and logged), never a traceback;
    # scaled out, the calibrators topic's history is the truth (contract §7)
    entries = admin.entries(cfg) if admin.scaled_out(cfg) else Registry(
        cfg.recalibration.output_dir, verify_keys=cfg.calibrators.verify_keys).entries()
    if args.json:
        json.dump(entries, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not entries:
        print(f"no calibrators in {cfg.recalibration.output_dir}")
        return 0
    print(f"{'model':<20} {'segment':<24} {'live':>4}  {'method':<12} {'fitted_at':<21} versions")
    for e in entries:
        print(f"{e['model']:<20} {e['segment']:<24} {e['live'] or '-':>4}  "
              f"{e['method'] or '-':<12} {e['fitted_at'] or '-':<21} "
              f"{','.join(map(str, e['versions']))}")
        if e.get("error"):
            print(f"  refused latest.json: {secrets.escape_control(e['error'])}")
    return 0


def cmd_calibrators_rollback(args: argparse.Namespace) -> int:
    from calmon.calibrators.signing import Signer
    from calmon.recal.registry import Registry

    cfg = _load_config(args.config)
    from calmon.cluster import admin

    if admin.scaled_out(cfg):  # the model's owner republishes (contract §7)
        doc = admin.rollback(cfg, args.model, args.segment, args.to)
        print(f"{args.model}/{args.segment}: v{args.to} republished as v{doc['version']} "
              "by its owner")
        return 0
    from calmon.io.calibrator_publisher import CalibratorPublisher
    from calmon.io.outbox import Outbox

    outbox = Outbox(cfg.kafka)
    topic = cfg.kafka.calibrators_topic
    publish = CalibratorPublisher(outbox, topic) if topic else None
    try:
        doc = Registry(cfg.recalibration.output_dir, publish,
                       signer=Signer.from_config(cfg.calibrators),
                       verify_keys=cfg.calibrators.verify_keys).rollback(
            args.model, args.segment, args.to)
    finally:
        outbox.close()  # flushes what it can; opens nothing when nothing was sent
    print(f"{args.model}/{args.segment}: v{args.to} republished as v{doc['version']}")
    return 0


EXAMPLES = {
    "run": "calmon run -c config.yaml          # metrics on :9108/metrics, SIGTERM stops",
    "demo": "calmon demo --duration 120         # broker, drifting traffic, daemon; Ctrl+C stops",
    "check-config": ("calmon check-config -c config.yaml # effective config, or every error\n"
                     "  calmon check-config -c config.yaml --probe   # and ask the broker"),
    "replay": ("calmon replay --predictions p.jsonl --labels l.jsonl --json\n"
               "  calmon replay --predictions p.jsonl --labels l.jsonl --recalibrate "
               "--html report.html\n"
               "  calmon replay --predictions p.jsonl --labels l.jsonl --every 1d --json"),
    "calibrators": ("calmon calibrators list -c config.yaml\n"
                    "  calmon calibrators rollback --model ctr --to 3 -c config.yaml\n"
                    "  calmon calibrators keygen                    # a signing key pair"),
}


def _example(name: str) -> str:
    return f"example:\n  {EXAMPLES[name]}"


def cmd_calibrators_keygen(args: argparse.Namespace) -> int:
    from calmon.calibrators.signing import keygen

    private, public = keygen()
    print("# A new Ed25519 key pair for signing calibrator documents.")
    print("# The private key is a secret: give it to calmon only, through the environment")
    print("# (calibrators.signing_key: ${CALMON_SIGNING_KEY}); serving code gets the public key.")
    print(f"CALMON_SIGNING_KEY={private}")
    print(f"public_key: {public}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(
        prog="calmon", description=__doc__, formatter_class=fmt,
        epilog="examples:\n" + "\n".join(f"  {e}" for e in EXAMPLES.values())
        + "\n\nenvironment: CALMON_LOG_LEVEL (debug|info|warning|error) overrides logging.level")
    p.add_argument("--version", action="version", version=f"calmon {package_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(sp: argparse.ArgumentParser, default: str | None = None) -> None:
        sp.add_argument("-c", "--config", default=default,
                        help="config.yaml (default: %(default)s)")

    sp = sub.add_parser("run", formatter_class=fmt, epilog=_example("run"),
                        help="the daemon: Kafka in, Prometheus out")
    with_config(sp, "config.yaml")
    sp.add_argument("--rescale", action="store_true",
                    help="when state.dir holds the state of another kafka.instance shape, "
                         "move it aside (state.dir/rescaled-*) and start with empty windows "
                         "from the group's committed offsets (README, \"Scaling out\"); "
                         "without it such a start exits 2")
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("demo", formatter_class=fmt, epilog=_example("demo"),
                        help="broker, drifting traffic and the daemon, no setup")
    sp.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                    help="stop after this many seconds (default: until Ctrl+C)")
    sp.add_argument("--rate", type=float, default=300.0, help="predictions per second")
    sp.add_argument("--port", type=int, default=9108, help="HTTP port for /metrics")
    sp.set_defaults(func=cmd_demo)

    sp = sub.add_parser("check-config", formatter_class=fmt, epilog=_example("check-config"),
                        help="validate a config and print the effective one")
    sp.add_argument("--probe", action="store_true",
                    help="also connect to the broker: topics exist and co-partition, and how "
                         "a sample of each input topic's records parses (exit 1 on failure)")
    sp.add_argument("--probe-timeout", type=float, default=15.0, metavar="SECONDS",
                    help="how long the probe waits for the broker (default: %(default)s)")
    with_config(sp, "config.yaml")
    sp.set_defaults(func=cmd_check_config)

    sp = sub.add_parser("replay", formatter_class=fmt, epilog=_example("replay"),
                        help="run the engine over JSONL files, no Kafka")
    sp.add_argument("--predictions", required=True, help="predictions, one JSON record a line")
    sp.add_argument("--labels", required=True, help="labels, one JSON record a line")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.add_argument("--recalibrate", action="store_true",
                    help="backtest the recalibration policy in event time (adds events)")
    sp.add_argument("--output-dir", default=None, metavar="DIR",
                    help="with --recalibrate: write published calibrators here")
    sp.add_argument("--html", default=None, metavar="FILE",
                    help="also write a self-contained HTML report (reliability diagrams, "
                         "confidence histograms, estimated vs realized accuracy)")
    sp.add_argument("--every", default=None, metavar="DURATION",
                    help="rows per period of event time (e.g. 1d: days from 00:00 UTC), "
                         "each with period_start/period_end, pending predictions and "
                         "estimates as of the period's end")
    with_config(sp)
    sp.set_defaults(func=cmd_replay)

    cal = sub.add_parser("calibrators", formatter_class=fmt, epilog=_example("calibrators"),
                        help="list or roll back published calibrators, make signing keys")
    calsub = cal.add_subparsers(dest="action", required=True)
    sp = calsub.add_parser("list", help="every model/segment with its live version")
    sp.add_argument("--json", action="store_true")
    with_config(sp, "config.yaml")
    sp.set_defaults(func=cmd_calibrators_list)
    sp = calsub.add_parser("rollback", help="republish an old version as the newest")
    sp.add_argument("--model", required=True)
    sp.add_argument("--segment", default=ALL)
    sp.add_argument("--to", type=int, required=True, metavar="VERSION")
    with_config(sp, "config.yaml")
    sp.set_defaults(func=cmd_calibrators_rollback)
    sp = calsub.add_parser("keygen", help="print a new Ed25519 key pair for signing documents")
    sp.set_defaults(func=cmd_calibrators_keygen)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as e:
        for problem in e.problems:
            print(problem, file=sys.stderr)
        return EXIT_CONFIG
    except StateError as e:
        print(f"calmon: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except CalmonError as e:
        print(f"calmon: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
