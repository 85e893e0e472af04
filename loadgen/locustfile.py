"""The locustfile the harness runs: one user group, configured by a JSON file.

    locust -f loadgen/locustfile.py --headless -u USERS -r USERS \\
        --zw-group-config GROUP.json [--only-summary] [--loglevel WARNING]

``GROUP.json`` is a :class:`loadgen.GroupRunConfig`: ``{"group": <UserGroupConfig>, "host":
"http://...", "model": "...", "records_path": "...", "seed": 0}`` (the path may also come from
the environment variable ``ZW_GROUP_CONFIG``). Locust collects user classes when it imports
this file, before it parses the command line, so the path is read from ``sys.argv`` here and
the option is also declared to Locust's parser so that it is accepted.

The process quits by itself once every user has sent its ``requests_per_user`` requests (an
open-loop group: once its schedule is sent and answered), and
exits 0 even if requests failed (failures are data: see the records file); it exits non-zero
only if user code raised. Without a configuration it defines no user class and Locust says so.

Distributed (Locust master and workers): the harness writes a per-group locustfile that embeds
the configuration (``loadgen._workers.locustfile_source``), so that workers on other machines
receive it from the master with ``locust -f - --worker``. A worker (environment variable
``ZW_WORKER_NAME``, see ``loadgen._workers``) writes its records and saturation samples to its
own files, ``records-<group>@<worker>.jsonl``; the master logs its workers to
``workers-<group>.jsonl`` and quits everybody once every worker's users are done.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import Any

from locust import events
from locust.env import Environment

from loadgen import (
    GroupRunConfig,
    exit_zero_on_request_failures,
    prompt_seed,
    quit_when_users_done,
    user_class_from_config,
)
from loadgen._saturation import ENV_VAR as SATURATION_ENV_VAR
from loadgen._saturation import sample_saturation
from loadgen._workers import group_file, this_worker

OPTION = "--zw-group-config"
ENV_VAR = "ZW_GROUP_CONFIG"


def _config_path() -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument(OPTION, dest="zw_group_config", default=None)
    known, _ = pre.parse_known_args(sys.argv[1:])
    return known.zw_group_config or os.environ.get(ENV_VAR) or None


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any, **_kwargs: Any) -> None:
    parser.add_argument(
        OPTION,
        type=str,
        default="",
        env_var=ENV_VAR,
        help="JSON file with the user group to run (loadgen.GroupRunConfig)",
    )


_installed: list[GroupRunConfig] = []


@events.init.add_listener
def _on_init(environment: Environment, **_kwargs: Any) -> None:
    quit_when_users_done(environment)
    exit_zero_on_request_failures(environment)
    worker = this_worker()
    saturation = os.environ.get(SATURATION_ENV_VAR)
    if worker is not None and _installed:
        saturation = str(
            group_file(worker.out_dir, "saturation", _installed[0].group.name, worker.name)
        )
    sample_saturation(environment, path=saturation)
    _freeze_gc_when_spawned(environment)
    if _installed:
        from loadgen._distributed import announce_and_forward, collect_on_master

        run = _installed[0]
        collect_on_master(environment, run_dir=run.records_path.parent, group=run.group.name)
        if worker is not None:
            announce_and_forward(environment, worker=worker, group=run.group.name)


def _freeze_gc_when_spawned(environment: Environment) -> None:
    """Once every user is spawned, move the objects alive then (modules, users, their open
    streams) out of the cyclic garbage collector's reach with ``gc.freeze()``. A full
    collection walks every tracked object while the gevent hub waits: with 5,000 open slow
    streams one took 0.3 to 0.8 s here, a loop lag every stream's timestamps would carry.
    Objects made later (records, chunks) are collected as usual."""
    frozen = False

    def freeze(**_kwargs: Any) -> None:
        nonlocal frozen
        if not frozen:
            frozen = True
            gc.freeze()  # no gc.collect() first: that would be the very stall avoided here

    environment.events.spawning_complete.add_listener(freeze)


def install_group(namespace: dict[str, Any], run: GroupRunConfig) -> None:
    """Bind the user class of ``run`` in ``namespace`` (a locustfile's ``globals()``).

    In a worker process (``ZW_WORKER_NAME`` set) the records go to the worker's own file
    ``records-<group>@<worker>.jsonl`` in ``ZW_WORKER_DIR`` instead of ``run.records_path``,
    and, in a closed loop, the prompt seed is derived from ``run.seed`` and the worker name
    (prompts stay deterministic, and differ between workers); an open-loop schedule is split
    ``run.processes`` ways by worker index.
    Raises ``ValueError`` for an invalid worker name.
    """
    worker = this_worker()
    records, seed = run.records_path, run.seed
    if worker is not None:
        records = group_file(worker.out_dir, "records", run.group.name, worker.name)
        if not run.group.open_loop:  # open loop: prompts follow the schedule's positions
            # User indices restart at 0 in every worker: without this, user 0 of every worker
            # would send the same prompts (and hit a prefix cache that one process would not).
            seed = prompt_seed(run.seed, "worker", worker.name)
    cls = user_class_from_config(
        run.group,
        host=run.host,
        model=run.model,
        records_path=records,
        seed=seed,
        processes=run.processes,
    )
    # Locust picks up every non-abstract User class among the locustfile's globals, so the
    # class must be bound under exactly one name.
    namespace[cls.__name__] = cls
    _installed[:] = [run]


def install_group_json(namespace: dict[str, Any], text: str) -> None:
    """:func:`install_group` with the :class:`GroupRunConfig` as JSON text (generated
    locustfiles). Raises ``pydantic.ValidationError`` for an invalid configuration."""
    install_group(namespace, GroupRunConfig.model_validate_json(text))


def _define_user_class() -> None:
    path = _config_path()
    if path:
        install_group(globals(), GroupRunConfig.from_file(path))


_define_user_class()
