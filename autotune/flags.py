"""Reading and writing vLLM flag lists. Fixed flags arrive as a list (`[--max-model-len, "1024"]`) or a
mapping (`{max_model_len: 1024}`); both end as one list, and constraints read values back out of it."""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def mapping_to_flags(values: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        elif value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


def flags_to_mapping(flags: Sequence[str]) -> dict[str, Any]:
    """`--max-model-len 1024 --enforce-eager --no-enable-prefix-caching` ->
    {max_model_len: "1024", enforce_eager: True, enable_prefix_caching: False}. `--x=v` is split."""
    out: dict[str, Any] = {}
    items = list(flags)
    i = 0
    while i < len(items):
        item = items[i]
        if not item.startswith("--"):
            i += 1
            continue
        if "=" in item:
            name, value = item[2:].split("=", 1)
            out[name.replace("-", "_")] = value
            i += 1
            continue
        name = item[2:].replace("-", "_")
        nxt = items[i + 1] if i + 1 < len(items) else None
        if nxt is not None and not nxt.startswith("--"):
            out[name] = nxt
            i += 2
        elif name.startswith("no_"):
            out[name[3:]] = False
            i += 1
        else:
            out[name] = True
            i += 1
    return out


def parallel_size(mapping: Mapping[str, Any]) -> int:
    """TP x PP x DP of one engine instance (flags_to_mapping's form; a missing or bad size counts as 1)."""
    n = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        try:
            n *= max(int(mapping.get(key) or 1), 1)
        except (TypeError, ValueError):
            pass
    return n


def flag_names(flags: Sequence[str]) -> list[str]:
    """The `--long-option` names in a flag list (values dropped), for checking against `--help`."""
    return [f.split("=", 1)[0] for f in flags if f.startswith("--")]


def with_env(flags: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
    """A launch's identity for deduplication: its flags and, as `--env:NAME=value` items, the environment
    its env knobs set (two candidates that differ only there are different candidates)."""
    return [*flags, *(f"--env:{k}={v}" for k, v in sorted((env or {}).items()))]
