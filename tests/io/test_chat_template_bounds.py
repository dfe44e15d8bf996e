"""A chat template comes from anywhere (a tokenizer_config.json off the Hub): its render is bounded. Each bomb
below ran until killed (3 GB in ~8 s) or was a raw RecursionError; now each is one `ChatTemplateError` that
names the template and the bound, within a second and a few MB."""

from __future__ import annotations

import resource
import time

import pytest

from zoo.io.tokenizer import ChatTemplateError
from zoo.io.tokenizer.chat import render_chat

MESSAGES = [{"role": "user", "content": "hello"}]
BOMBS = {
    "string repeat": "{{ 'a' * 10**9 }}",
    "nested loops": "{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}",
    "big range": "{{ range(10**9)|join }}",
    "format width": "{{ '%0999999999d'|format(1) }}",
    "str.format width": "{{ '{:>999999999}'.format(1) }}",
    "center": "{{ 'x'.center(10**9) }}",
    "center filter": "{{ 'x'|center(10**9) }}",
    "lipsum": "{{ lipsum(10**6) }}",
    "tojson indent": "{{ messages|tojson(indent=10**9) }}",
    "strftime": "{{ strftime_now('%Y' * 10**6) }}",
    "string doubling": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "list doubling": "{% set ns = namespace(s=[1]) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "power tower": "{{ 9 ** (9 ** 9) }}",
    "output": "{% for i in range(10**5) %}{{ 'x' * 1000 }}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_template_bomb_is_one_error_naming_the_template_within_a_second(name: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=r"^evil/tokenizer_config.json: the chat template ") as caught:
        render_chat(BOMBS[name], MESSAGES, where="evil/tokenizer_config.json", special_tokens={})
    assert time.perf_counter() - started < 5  # each ran until killed; here ~0.1 s (slack for a busy CI)
    # KiB: no gigabytes. The list doubling reaches its 8 Mi-item bound (~200 MB of pointers and copies), so
    # the margin is wide; a bomb ran to 3 GB before the bounds.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 600_000
    assert "\n" not in str(caught.value)


def test_a_recursive_macro_is_one_error_not_a_recursion_traceback() -> None:
    template = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
    with pytest.raises(ChatTemplateError, match=r"t\.jinja: the chat template recurses without end"):
        render_chat(template, MESSAGES, where="t.jinja", special_tokens={})


@pytest.mark.parametrize(
    "template",
    [
        "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",  # Jinja's parser recurses past Python's stack
        "{% if true %}" * 150 + "x" + "{% endif %}" * 150,  # Python's compiler: too many indentation levels
    ],
    ids=["brackets", "blocks"],
)
def test_a_template_nested_too_deeply_to_compile_is_one_error(template: str) -> None:
    """Compiling it was a raw RecursionError (or IndentationError) traceback: only the render was guarded."""
    with pytest.raises(
        ChatTemplateError, match=r"^t\.jinja: the chat template is nested too deeply to compile"
    ):
        render_chat(template, MESSAGES, where="t.jinja", special_tokens={})


def test_a_template_that_renders_nothing_is_refused() -> None:
    with pytest.raises(
        ChatTemplateError, match=r"t\.jinja: the chat template renders nothing for these messages"
    ):
        render_chat("{% for m in messages %}{% endfor %}", MESSAGES, where="t.jinja", special_tokens={})


def test_real_templates_stay_well_inside_the_bounds() -> None:
    """What a real template does (loops over the messages, tojson, format, padding) is untouched."""
    template = (
        "{% for m in messages %}{{ '<|%s|>'|format(m['role']) }}{{ m['content'].center(9) }}"
        "{% for i in range(3) %}.{% endfor %}{{ m|tojson(indent=2) }}{% endfor %}{{ 2 ** 10 }}"
    )
    text = render_chat(template, MESSAGES * 50, where="t.jinja", special_tokens={})
    assert text.startswith("<|user|>  hello  ...{") and text.endswith("}1024")
