"""Every server option can be set by a CL_MCP_* variable, checked exactly as
its flag is: a bad value is one line on stderr naming the variable, exit 2."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cl_mcp.cli.main import build_parser, env_variable

CL_MCP = str(Path(sys.executable).parent / "cl-mcp")

BAD = {
    "CL_MCP_CONNECT": "garbage",
    "CL_MCP_EVAL_TIMEOUT": "-3",
    "CL_MCP_LOAD_TIMEOUT": "soon",
    "CL_MCP_MAX_OUTPUT": "999",
    "CL_MCP_MAX_RESULT_CHARS": "10",
    "CL_MCP_KEEP_OUTPUT": "-1",
    "CL_MCP_MAX_SUSPENDED": "65",
    "CL_MCP_SUSPEND_TIMEOUT": "nan",
    "CL_MCP_LOG_LEVEL": "loud",
    "CL_MCP_NO_SAVED_CORE": "maybe",
    "CL_MCP_HEAP_SIZE": "100",
}

GOOD = {  # variable: (value, the option's attribute, what it becomes)
    "CL_MCP_CONNECT": ("example.com:4006", "connect", ("example.com", 4006)),
    "CL_MCP_SBCL": ("/opt/sbcl/bin/sbcl", "sbcl", "/opt/sbcl/bin/sbcl"),
    "CL_MCP_SLIME_DIR": ("/opt/slime", "slime_dir", "/opt/slime"),
    "CL_MCP_NO_SAVED_CORE": ("1", "no_saved_core", True),
    "CL_MCP_HEAP_SIZE": ("2048", "heap_size", 2048),
    "CL_MCP_EVAL_TIMEOUT": ("2.5", "eval_timeout", 2.5),
    "CL_MCP_LOAD_TIMEOUT": ("60", "load_timeout", 60.0),
    "CL_MCP_ANSWER_WITHIN": ("5", "answer_within", 5.0),
    "CL_MCP_MAX_BACKGROUND": ("2", "max_background", 2),
    "CL_MCP_MAX_OUTPUT": ("5000", "max_output", 5000),
    "CL_MCP_MAX_RESULT_CHARS": ("1000", "max_result_chars", 1000),
    "CL_MCP_KEEP_OUTPUT": ("0", "keep_output", 0),
    "CL_MCP_MAX_SUSPENDED": ("0", "max_suspended", 0),
    "CL_MCP_SUSPEND_TIMEOUT": ("30", "suspend_timeout", 30.0),
    "CL_MCP_LOG_LEVEL": ("debug", "log_level", "debug"),
}


def server_options():
    return [action for action in build_parser({})._actions
            if action.option_strings and action.dest not in ("help", "version")]


def test_every_option_has_a_variable_named_after_it_and_listed_in_help():
    help_text = " ".join(build_parser({}).format_help().split())
    names = {env_variable(option) for option in server_options()}
    assert names == set(GOOD)
    for option in server_options():
        assert env_variable(option) == "CL_MCP_" + option.option_strings[0][2:].upper().replace("-", "_")
        assert f"[env {env_variable(option)}]" in help_text


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_exits_2_with_one_line_naming_the_variable(name, capsys):
    with pytest.raises(SystemExit) as exit:
        build_parser({name: BAD[name]})
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cl-mcp: error: {name}={BAD[name]}: must be ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_good_value_is_applied(name):
    text, attribute, value = GOOD[name]
    assert getattr(build_parser({name: text}).parse_args([]), attribute) == value


def test_the_command_line_wins_over_the_environment():
    parser = build_parser({"CL_MCP_EVAL_TIMEOUT": "7", "CL_MCP_LOG_LEVEL": "error",
                           "CL_MCP_CONNECT": "4006"})
    args = parser.parse_args(["--eval-timeout", "3", "--log-level", "debug", "--connect", "h:4007"])
    assert (args.eval_timeout, args.log_level, args.connect) == (3.0, "debug", ("h", 4007))


def test_an_empty_variable_counts_as_unset():
    args = build_parser({"CL_MCP_EVAL_TIMEOUT": "", "CL_MCP_CONNECT": ""}).parse_args([])
    assert (args.eval_timeout, args.connect) == (30.0, None)


def test_a_value_with_a_line_break_stays_on_one_line(capsys):
    with pytest.raises(SystemExit):
        build_parser({"CL_MCP_LOG_LEVEL": "info\nmore"})
    assert capsys.readouterr().err == ("cl-mcp: error: CL_MCP_LOG_LEVEL='info\\nmore': "
                                       "must be one of debug, info, warning, error\n")


# ------------------------------------------------------------ the console script

def run_cl_mcp(variable: str, value: str, *args: str) -> subprocess.CompletedProcess:
    env = {key: text for key, text in os.environ.items() if not key.startswith("CL_MCP_")}
    return subprocess.run([CL_MCP, *args], env={**env, variable: value}, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=30)


@pytest.mark.parametrize("variable, value, args, message", [
    ("CL_MCP_EVAL_TIMEOUT", "-3", (), "must be a positive number of seconds"),
    ("CL_MCP_LOG_LEVEL", "loud", (), "must be one of debug, info, warning, error"),
    ("CL_MCP_CONNECT", "garbage", ("--help",), "must be [HOST:]PORT, such as 4005 or 127.0.0.1:4005"),
    ("CL_MCP_MAX_OUTPUT", "lots", ("eval", "(+ 1 2)"), "must be an integer from 1000 to 64000000"),
])
def test_the_console_script_reports_a_bad_variable_in_one_line(variable, value, args, message):
    out = run_cl_mcp(variable, value, *args)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", f"cl-mcp: error: {variable}={value}: {message}\n")
