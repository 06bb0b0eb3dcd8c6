"""A griffe extension for the API reference: the docstrings' `>>>` examples render as code.

The docstrings hold doctest examples as plain paragraphs (no "Examples:" header); Markdown would
otherwise read them as prose (and `[a, b]` output as a link). Each run of lines from a `>>>` prompt
to the next blank line becomes a fenced `pycon` block.
"""
import griffe


def fence_doctests(text: str) -> str:
    out, in_example = [], False
    for line in text.splitlines():
        starts = line.lstrip().startswith(">>>")
        if starts and not in_example:
            out.append("```pycon")
            in_example = True
        elif in_example and not line.strip():
            out.append("```")
            in_example = False
        out.append(line)
    if in_example:
        out.append("```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)
