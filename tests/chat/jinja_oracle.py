#!/usr/bin/python3
"""Renders chat templates exactly as Hugging Face transformers does (the test oracle).

stdin: a JSON array of {"template": str, "context": object}.
stdout: a JSON array, one {"ok": true, "output": str} or {"ok": false, "error": str} per case.
The environment matches transformers' _compile_jinja_template: an ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and loopcontrols, HF's tojson override and its two globals.
"""
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = make_environment()
    cases = json.load(sys.stdin)
    results = []
    for case in cases:
        try:
            template = env.from_string(case["template"])
            results.append({"ok": True, "output": template.render(**case["context"])})
        except Exception as e:  # every failure is an expected answer: kvlm must fail too
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout, ensure_ascii=True)


if __name__ == "__main__":
    main()
