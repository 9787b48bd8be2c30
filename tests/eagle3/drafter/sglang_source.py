"""Read SGLang's drafter classes from the real wheel: parameter names/shapes and load_weights.

No SGLang import (it needs CUDA kernels): the sources are parsed with `ast`.

* `module_params` interprets the `__init__` bodies of the drafter classes symbolically for a
  given config (a real transformers config object): scalar statements are evaluated, `if`s
  whose condition evaluates take one branch (otherwise both), submodule constructors recurse
  into the classes defined in the parsed files, and the parameter-holding leaf layers (linear
  layers, RMSNorm, embeddings) contribute `weight` (and `bias`) with their shapes at TP 1.
* `load_weights` compiles the real `load_weights` method so it can be run against fake
  parameters that record what each checkpoint tensor was loaded into.
* `capture_rule` compiles deepseek_v2's `set_eagle3_layers_to_capture`.
"""

from __future__ import annotations

import ast
import copy
import logging
import re
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FILES = {
    "llama_eagle3": "sglang/srt/models/llama_eagle3.py",
    "llama": "sglang/srt/models/llama.py",
    "kimi_k25_eagle3": "sglang/srt/models/kimi_k25_eagle3.py",
    "deepseek_v2": "sglang/srt/models/deepseek_v2.py",
    "linear": "sglang/srt/layers/linear.py",
}

# leaf layers: how their constructor arguments become parameter shapes (TP 1)
LEAVES = {
    "Linear": lambda a: {"weight": (a["out_features"], a["in_features"])},
    "ReplicatedLinear": lambda a: {"weight": (a["output_size"], a["input_size"])},
    "ColumnParallelLinear": lambda a: {"weight": (a["output_size"], a["input_size"])},
    "RowParallelLinear": lambda a: {"weight": (a["output_size"], a["input_size"])},
    "MergedColumnParallelLinear": lambda a: {"weight": (sum(a["output_sizes"]), a["input_size"])},
    "QKVParallelLinear": lambda a: {
        "weight": (
            (a["total_num_heads"] + 2 * (a["total_num_kv_heads"] or a["total_num_heads"]))
            * a["head_size"],
            a["hidden_size"],
        )
    },
    "RMSNorm": lambda a: {"weight": (a["hidden_size"],)},
    "VocabParallelEmbedding": lambda a: {"weight": (a["num_embeddings"], a["embedding_dim"])},
    "ParallelLMHead": lambda a: {"weight": (a["num_embeddings"], a["embedding_dim"])},
}
# torch / layernorm / embedding signatures (not in the parsed files)
EXTERNAL_SIGNATURES = {
    "Linear": (["in_features", "out_features", "bias"], {"bias": True}),
    "RMSNorm": (["hidden_size", "eps"], {}),
    "VocabParallelEmbedding": (["num_embeddings", "embedding_dim"], {}),
    "ParallelLMHead": (["num_embeddings", "embedding_dim", "bias"], {"bias": False}),
}


class Unknown:
    """A value the interpreter could not evaluate."""

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = Unknown()


class Mod:
    """A module instance: scalar attributes, child modules, own parameters."""

    def __init__(self, cls: str) -> None:
        object.__setattr__(self, "_cls", cls)
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_attrs", {})

    def __getattr__(self, name: str) -> Any:
        if name in self._children:
            return self._children[name]
        if name in self._attrs:
            return self._attrs[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Mod):
            self._children[name] = value
            self._attrs.pop(name, None)
        else:
            self._attrs[name] = value
            self._children.pop(name, None)

    def named_parameters(self, prefix: str = "", seen=None):
        seen = set() if seen is None else seen
        if id(self) in seen:
            return
        seen.add(id(self))
        for n, shape in self._params.items():
            yield prefix + n, shape
        for n, child in self._children.items():
            yield from child.named_parameters(f"{prefix}{n}.", seen)


class Source:
    def __init__(self, wheel: Path) -> None:
        with zipfile.ZipFile(wheel) as z:
            self.text = {k: z.read(p).decode() for k, p in FILES.items()}
        self.tree = {k: ast.parse(t) for k, t in self.text.items()}
        self.classes = {
            k: {n.name: n for n in t.body if isinstance(n, ast.ClassDef)}
            for k, t in self.tree.items()
        }
        self.funcs = {
            k: {n.name: n for n in t.body if isinstance(n, ast.FunctionDef)}
            for k, t in self.tree.items()
        }
        self.imports: dict[str, dict[str, str]] = {}
        for k, t in self.tree.items():
            m = {}
            for n in t.body:
                if isinstance(n, ast.ImportFrom) and n.module:
                    short = n.module.rsplit(".", 1)[-1]
                    for a in n.names:
                        m[a.asname or a.name] = short
            self.imports[k] = m

    def resolve(self, module: str, name: str, exclude: ast.ClassDef | None = None):
        """(module, ClassDef) for a class name used in `module`, or None."""
        local = self.classes[module].get(name)
        if local is not None and local is not exclude:
            return module, local
        src = self.imports[module].get(name)
        if src in self.classes and name in self.classes[src]:
            return src, self.classes[src][name]
        return None

    def method(self, module: str, cls: str, name: str) -> ast.FunctionDef:
        for n in self.classes[module][cls].body:
            if isinstance(n, ast.FunctionDef) and n.name == name:
                return n
        raise KeyError(f"{module}.{cls}.{name}")


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


class Interpreter:
    def __init__(self, src: Source) -> None:
        self.src = src
        self.conditional: set[str] = set()

    # -- namespace helpers ---------------------------------------------------------------

    def _globals(self, module: str) -> dict[str, Any]:
        g: dict[str, Any] = {
            "getattr": getattr,
            "hasattr": hasattr,
            "len": len,
            "int": int,
            "bool": bool,
            "isinstance": isinstance,
            "list": list,
            "dict": dict,
            "min": min,
            "max": max,
            "range": range,
            "copy": copy,
            "get_parallel": lambda: SimpleNamespace(
                tp_size=1, attn_tp_size=1, attn_dcp_size=1, pp_group=UNKNOWN
            ),
        }
        for name, fn in self.src.funcs[module].items():  # module-level helpers, e.g. aux count
            ns: dict[str, Any] = dict(g)
            try:
                exec(compile(ast.Module([fn], []), module, "exec"), ns)
                g[name] = ns[name]
            except Exception:
                pass
        return g

    def _eval(self, node: ast.expr, env: dict[str, Any]) -> Any:
        try:
            value = eval(compile(ast.Expression(node), "<sglang>", "eval"), env)
        except Exception:
            return UNKNOWN
        return value

    # -- construction ----------------------------------------------------------------------

    def construct(self, module: str, call: ast.Call, env: dict[str, Any], path: str, cond: bool):
        """Evaluate a constructor call; returns a Mod, or UNKNOWN for non-module calls."""
        name = _call_name(call.func)
        if name == "ModuleList":
            return self._module_list(module, call, env, path, cond)
        args = [self._eval(a, env) for a in call.args]
        kwargs = {k.arg: self._eval(k.value, env) for k in call.keywords if k.arg}
        if name in LEAVES:
            return self._leaf(name, args, kwargs, path, cond)
        found = self.src.resolve(module, name) if name else None
        if found is None:
            return UNKNOWN
        mod = Mod(name)
        self.run_init(found[0], found[1], mod, args, kwargs, path, cond)
        return mod

    def _signature(self, cls: str):
        if cls in EXTERNAL_SIGNATURES:
            return EXTERNAL_SIGNATURES[cls]
        fn = self.src.method("linear", cls, "__init__")
        names = [a.arg for a in fn.args.args[1:]]
        defaults = {}
        for a, d in zip(
            fn.args.args[len(fn.args.args) - len(fn.args.defaults) :], fn.args.defaults, strict=True
        ):
            defaults[a.arg] = self._eval(d, {})
        for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
            names.append(a.arg)
            if d is not None:
                defaults[a.arg] = self._eval(d, {})
        return names, defaults

    def _leaf(self, cls, args, kwargs, path, cond):
        names, defaults = self._signature(cls)
        bound = dict(defaults)
        bound.update(zip(names, args, strict=False))
        bound.update(kwargs)
        mod = Mod(cls)
        try:
            shapes = LEAVES[cls](bound)
        except Exception:
            shapes = {"weight": UNKNOWN}
        if bound.get("bias") is True:
            shapes["bias"] = (
                (shapes["weight"][0],) if isinstance(shapes["weight"], tuple) else UNKNOWN
            )
        mod._params.update(shapes)
        if cond:
            self.conditional.update(f"{path}{n}" for n in shapes)
        for k, v in bound.items():
            object.__getattribute__(mod, "_attrs")[k] = v
        return mod

    def _module_list(self, module, call, env, path, cond):
        out = Mod("ModuleList")
        if not call.args:
            return out
        arg = call.args[0]
        if isinstance(arg, ast.ListComp | ast.GeneratorExp) and len(arg.generators) == 1:
            gen = arg.generators[0]
            seq = self._eval(gen.iter, env)
            if isinstance(seq, Unknown) or not isinstance(gen.target, ast.Name):
                return out
            for i, item in enumerate(seq):
                sub = dict(env)
                sub[gen.target.id] = item
                child = self.construct(module, arg.elt, sub, f"{path}{i}.", cond)
                if isinstance(child, Mod):
                    setattr(out, str(i), child)
        elif isinstance(arg, ast.List):
            for i, elt in enumerate(arg.elts):
                if isinstance(elt, ast.Call):
                    child = self.construct(module, elt, env, f"{path}{i}.", cond)
                    if isinstance(child, Mod):
                        setattr(out, str(i), child)
        return out

    def run_init(self, module, cls: ast.ClassDef, self_obj: Mod, args, kwargs, path, cond):
        fn = next(
            (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
        )
        if fn is None:  # inherit __init__
            base = self._base(module, cls)
            if base is not None:
                self.run_init(base[0], base[1], self_obj, args, kwargs, path, cond)
            return
        env = self._globals(module)
        params = [a.arg for a in fn.args.args]
        defaults = fn.args.defaults
        for a, d in zip(params[len(params) - len(defaults) :], defaults, strict=True):
            env[a] = self._eval(d, env)
        for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
            env[a.arg] = self._eval(d, env) if d is not None else UNKNOWN
        env.update(zip(params[1:], args, strict=False))
        env.update(kwargs)
        env[params[0]] = self_obj
        self._block(module, cls, fn.body, env, path, cond)

    def _base(self, module, cls: ast.ClassDef):
        for b in cls.bases:
            name = _call_name(b)
            if name and name != "Module":
                found = self.src.resolve(module, name, exclude=cls)
                if found is not None:
                    return found
        return None

    def _block(self, module, cls, body, env, path, cond) -> bool:
        """Run statements; returns False when a `return` ended the function."""
        for st in body:
            if isinstance(st, ast.Return):
                return False
            if isinstance(st, ast.If):
                test = self._eval(st.test, env)
                if isinstance(test, Unknown):
                    self._block(module, cls, st.body, dict(env) | {}, path, True)
                    self._block(module, cls, st.orelse, env, path, True)
                elif test:
                    if not self._block(module, cls, st.body, env, path, cond):
                        return False
                elif not self._block(module, cls, st.orelse, env, path, cond):
                    return False
            elif isinstance(st, ast.With | ast.Try):
                if not self._block(module, cls, st.body, env, path, cond):
                    return False
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                f = st.value.func
                if (
                    isinstance(f, ast.Attribute)
                    and f.attr == "__init__"
                    and isinstance(f.value, ast.Call)
                    and _call_name(f.value.func) == "super"
                ):
                    base = self._base(module, cls)
                    if base is not None:
                        args = [self._eval(a, env) for a in st.value.args]
                        kwargs = {
                            k.arg: self._eval(k.value, env) for k in st.value.keywords if k.arg
                        }
                        self.run_init(base[0], base[1], env["self"], args, kwargs, path, cond)
            elif isinstance(st, ast.Assign | ast.AnnAssign):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                if st.value is None or len(targets) != 1:
                    continue
                self._assign(module, targets[0], st.value, env, path, cond)
        return True

    def _assign(self, module, target, value, env, path, cond):
        if isinstance(target, ast.Attribute):
            owner = self._eval(target.value, env)
            if not isinstance(owner, Mod):
                return
            sub_path = path + self._path_of(target.value, env) + target.attr + "."
            if isinstance(value, ast.Call) and self._is_constructor(module, value):
                obj = self.construct(module, value, env, sub_path, cond)
            else:
                obj = self._eval(value, env)
            setattr(owner, target.attr, obj)
        elif isinstance(target, ast.Name):
            if isinstance(value, ast.Call) and self._is_constructor(module, value):
                env[target.id] = self.construct(module, value, env, path, cond)
            else:
                env[target.id] = self._eval(value, env)

    def _path_of(self, node, env) -> str:
        """Dotted path of `self.a.b` (relative to self); local aliases of submodules resolved."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id != "self":
            obj, selfobj = env.get(node.id), env.get("self")
            for name, child in getattr(selfobj, "_children", {}).items():
                if child is obj:
                    parts.append(name)
        return "".join(p + "." for p in reversed(parts))

    def _is_constructor(self, module, call: ast.Call) -> bool:
        name = _call_name(call.func)
        return (
            name == "ModuleList"
            or name in LEAVES
            or self.src.resolve(module, name or "") is not None
        )


def module_params(src: Source, module: str, cls: str, config) -> tuple[dict[str, Any], set[str]]:
    """Parameter name -> shape of `module.cls(config)`; plus names that sit behind unknown ifs."""
    it = Interpreter(src)
    root = Mod(cls)
    it.run_init(module, src.classes[module][cls], root, [config], {}, "", False)
    return dict(root.named_parameters()), it.conditional


class FakeParam:
    def __init__(self, name: str, shape) -> None:
        self.name, self.shape, self.loads = name, shape, []

    def weight_loader(self, param, tensor, shard_id=None):
        self.loads.append((shard_id, tuple(tensor.shape)))


def load_weights(src: Source, module: str, cls: str):
    """The real `load_weights`, compiled from the wheel's source with a recording loader."""
    import torch

    fn = src.method(module, cls, "load_weights")
    recorder: list = []

    def default_weight_loader(param, tensor, *rest):
        param.loads.append((rest[0] if rest else None, tuple(tensor.shape)))

    env = {
        "torch": torch,
        "re": re,
        "logger": logging.getLogger("sglang-source-test"),
        "default_weight_loader": default_weight_loader,
        "Iterable": Any,
        "Tuple": Any,
    }
    exec(compile(ast.Module([fn], []), FILES[module], "exec"), env)
    return env["load_weights"], recorder


def run_load_weights(src: Source, module: str, cls: str, params: dict[str, Any], tensors: dict):
    """Feed `tensors` to the real load_weights over fake params; returns (params, hot_token_id)."""
    fake = {n: FakeParam(n, s) for n, s in params.items()}
    fn, _ = load_weights(src, module, cls)
    me = SimpleNamespace(
        named_parameters=lambda: iter(fake.items()),
        hot_token_id=None,
        post_load_weights=lambda: None,
    )
    fn(me, list(tensors.items()))
    return fake, me.hot_token_id


def capture_rule(src: Source):
    """deepseek_v2's set_eagle3_layers_to_capture as a function (layer_ids, num_layers) -> ids."""
    cls = next(
        c
        for c in src.classes["deepseek_v2"].values()
        if any(
            isinstance(n, ast.FunctionDef) and n.name == "set_eagle3_layers_to_capture"
            for n in c.body
        )
    )
    fn = src.method("deepseek_v2", cls.name, "set_eagle3_layers_to_capture")
    env: dict[str, Any] = {"Optional": Any, "List": Any}
    exec(compile(ast.Module([fn], []), FILES["deepseek_v2"], "exec"), env)

    def rule(layer_ids, num_layers):
        me = SimpleNamespace(
            pp_group=SimpleNamespace(is_last_rank=True),
            config=SimpleNamespace(num_hidden_layers=num_layers),
            model=SimpleNamespace(),
        )
        env["set_eagle3_layers_to_capture"](me, layer_ids)
        return me.model.layers_to_capture

    return rule
