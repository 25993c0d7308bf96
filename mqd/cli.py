"""The ``mqd`` command. Each subcommand imports its module lazily so ``mqd --help`` stays fast."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mqd.config import ConfigError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="mqd")
def main() -> None:
    """mqd: pull a partitioned message queue and land it exactly once as Parquet for Spark."""


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(path_type=Path),
              help="The node's TOML file (see config/).")
def broker(config_path: Path) -> None:
    """Run one broker node in the foreground.

    \b
    Example:
      mqd broker --config config/single.toml
    """
    from mqd.broker.server import run_node

    try:
        run_node(config_path)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


@main.command()
@click.option("--bootstrap", default="http://127.0.0.1:9400", show_default=True,
              help="Any broker node's URL.")
@click.option("--topic", required=True)
@click.option("--count", default=1000, show_default=True, type=int)
@click.option("--size", default=100, show_default=True, type=int, help="Value size in bytes.")
@click.option("--rate", default=0.0, show_default=True, type=float,
              help="Records per second, 0 = as fast as possible.")
@click.option("--keys", default=0, show_default=True, type=int,
              help="Number of distinct keys (0 = no keys; keyed records hash to a partition).")
@click.option("--batch", default=1000, show_default=True, type=int, help="Records per batch.")
@click.option("--acks", default="master", type=click.Choice(["master", "all"]), show_default=True)
@click.option("--token", envvar="MQD_TOKEN", default=None, help="Bearer token, if the cluster needs one.")
def produce(bootstrap: str, topic: str, count: int, size: int, rate: float, keys: int,
            batch: int, acks: str, token: str | None) -> None:
    """Produce test records to a topic.

    \b
    Example:
      mqd produce --topic events --count 100000 --size 100 --rate 50000
    """
    from mqd.producer import produce_cli

    sys.exit(produce_cli(bootstrap=bootstrap, topic=topic, count=count, size=size, rate=rate,
                         keys=keys, batch=batch, acks=acks, token=token))


if __name__ == "__main__":
    main()
