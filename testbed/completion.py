"""Shell completion for `testbed`, generated from its argparse parser: `testbed completion
bash` prints a bash script that completes the verbs, each verb's flags, the values of
flags with a fixed list (--format, --workload ...), topology names (and .toml files) for
a topology argument, .toml files for an experiment and directories for a results folder.

    source <(testbed completion bash)        # or save it under bash-completion's dir
"""

from __future__ import annotations

import argparse
import re

SHELLS = ("bash",)
WORD_RE = re.compile(r"^[A-Za-z0-9_.:+=,/@-]+$")   # what goes in a compgen -W list unquoted
# What a positional argument completes to, by its dest; TOPOLOGY also lists the names.
FILES = '$(compgen -f -- "$cur")'
FILES_TOML = "$(compgen -f -X '!*.toml' -- \"$cur\")"
POSITIONALS = {"experiment": FILES_TOML,
               "folder": "$(compgen -d -- \"$cur\")"}


def _words(items) -> str:
    words = [str(w) for w in items if WORD_RE.match(str(w))]
    return " ".join(words)


def _verbs(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings]


def bash_script(parser: argparse.ArgumentParser, topologies: list[str]) -> str:
    """The bash completion script of `parser` (a prog with verbs); `topologies`: the names
    a topology argument takes."""
    prog = parser.prog
    func = "_" + re.sub(r"\W", "_", prog)
    verbs = _verbs(parser)
    top_opts = [s for a in _options(parser) for s in a.option_strings]
    choice_cases, value_opts, flag_cases, positional_cases = [], [], [], []
    for verb, sub in verbs.items():
        flags = _words(s for a in _options(sub) for s in a.option_strings)
        flag_cases.append(f"            {verb}) {_reply(_compgen(flags))} ;;")
        for a in _options(sub):
            if a.nargs == 0:             # a switch: nothing follows it
                continue
            for s in a.option_strings:
                value_opts.append(f'"{verb} {s}"')
                if a.choices:
                    choice_cases.append(f'        "{verb} {s}") '
                                        f"{_reply(_compgen(_words(a.choices)))}; return ;;")
        expr = _positional(sub, topologies)
        if expr:
            positional_cases.append(f"            {verb}) {_reply(expr)} ;;")
    lines = [
        f"# bash completion for {prog} (written by '{prog} completion bash')",
        f"{func}() {{",
        "    local cur prev verb i",
        '    cur="${COMP_WORDS[COMP_CWORD]}"',
        '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    verb=""',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in',
        "            -*) ;;",
        '            *) verb="${COMP_WORDS[i]}"; break ;;',
        "        esac",
        "    done",
        '    if [[ -z "$verb" ]]; then',
        f"        {_reply(_compgen(_words([*verbs, *top_opts])))}",
        "        return",
        "    fi",
        '    case "$verb $prev" in',
        *choice_cases,
        f"        {'|'.join(value_opts) or '__none__'}) {_reply(FILES)}; return ;;",
        "    esac",
        '    if [[ "$cur" == -* ]]; then',
        '        case "$verb" in',
        *flag_cases,
        "        esac",
        "        return",
        "    fi",
        '    case "$verb" in',
        *positional_cases,
        "    esac",
        "}",
        f"complete -o filenames -F {func} {prog}",
    ]
    return "\n".join(lines) + "\n"


def _positional(sub: argparse.ArgumentParser, topologies: list[str]) -> str | None:
    """What a verb's first positional argument completes to (None: nothing offered)."""
    positional = next((a for a in sub._actions if not a.option_strings
                       and a.nargs != argparse.REMAINDER), None)
    if positional is None:
        return None
    if positional.choices:
        return _compgen(_words(positional.choices))
    if positional.dest == "topology":
        return f"{_compgen(_words(topologies))} {FILES_TOML}"
    return POSITIONALS.get(positional.dest)


def _compgen(words: str) -> str:
    return f'$(compgen -W "{words}" -- "$cur")'


def _reply(expr: str) -> str:
    return f"COMPREPLY=({expr})"
