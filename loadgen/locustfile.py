"""The locustfile the harness runs: one user group, configured by a JSON file.

    locust -f loadgen/locustfile.py --headless -u USERS -r USERS \\
        --zw-group-config GROUP.json [--only-summary] [--loglevel WARNING]

``GROUP.json`` is a :class:`loadgen.GroupRunConfig`: ``{"group": <UserGroupConfig>, "host":
"http://...", "model": "...", "records_path": "...", "seed": 0}`` (the path may also come from
the environment variable ``ZW_GROUP_CONFIG``). Locust collects user classes when it imports
this file, before it parses the command line, so the path is read from ``sys.argv`` here and
the option is also declared to Locust's parser so that it is accepted.

The process quits by itself once every user has sent its ``requests_per_user`` requests, and
exits 0 even if requests failed (failures are data: see the records file); it exits non-zero
only if user code raised. Without a configuration it defines no user class and Locust says so.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from locust import events
from locust.env import Environment

from loadgen import (
    GroupRunConfig,
    exit_zero_on_request_failures,
    quit_when_users_done,
    user_class_from_config,
)
from loadgen._saturation import ENV_VAR as SATURATION_ENV_VAR
from loadgen._saturation import sample_saturation

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


@events.init.add_listener
def _on_init(environment: Environment, **_kwargs: Any) -> None:
    quit_when_users_done(environment)
    exit_zero_on_request_failures(environment)
    sample_saturation(environment, path=os.environ.get(SATURATION_ENV_VAR))


def _define_user_class() -> None:
    # Locust picks up every non-abstract User class among this module's globals, so the class
    # must be bound under exactly one name.
    path = _config_path()
    if not path:
        return
    run = GroupRunConfig.from_file(path)
    cls = user_class_from_config(
        run.group, host=run.host, model=run.model, records_path=run.records_path, seed=run.seed
    )
    globals()[cls.__name__] = cls


_define_user_class()
