"""Damaged model files, and a loader that tells a clear error from a crash or a hang.

``gguf_layout(buf)`` maps where each field of a GGUF header lies (counts, every key/value and tensor
info, the data start); ``mutate_gguf(buf, rng)`` returns one damaged copy and what was done to it:
truncation at any offset, flipped bytes in the header or the data, wrong tensor and key counts, string
lengths and array counts, value and tensor types, dimension counts and dimensions, tensor offsets,
duplicated or missing keys and tensors.

``LoadWorker(kind)`` loads files in a child process, one after the other, and reports each as
``ok``, ``error`` (the exception's type and message), ``crash`` (the child died: a signal or an abort)
or ``hang`` (no answer within the timeout); the child is restarted after a crash or a hang. Kinds:
``target`` (``Target``, then a 3-token prefill), ``drafter`` (an ``Engine`` with a good target and
the file as its drafter, three tokens generated), ``meta`` (``read_gguf_meta``, the reader of the
converter and the trainer) and ``zlab``: a z-lab checkpoint folder (``config.json`` +
``model.safetensors``, DFlash or DFlash2, damaged by ``mutate_checkpoint``) converted by
``tfm-convert``'s ``convert_checkpoint`` for a good target; ``requantize``: a drafter GGUF written again
as Q8_0 by the same call (its requantize path). A failed conversion that leaves any file behind in the
folder is reported as ``partial``.

    python -m tfm_local.testing.fuzz --kind target --model tiny.gguf -n 2000 --seed 1 --out fuzz.json
    python -m tfm_local.testing.fuzz --kind zlab --model CHECKPOINT_DIR --target tiny.gguf -n 500
    python -m tfm_local.testing.fuzz --kind requantize --model drafter.gguf --target tiny.gguf -n 500

(the longer run of the docs); ``tests/test_fuzz.py`` runs a bounded one in CI.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: GGUF value types whose payload has a fixed size (bytes), by type id (ggml docs/gguf.md)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass
class Field:
    """Where one key/value pair or tensor info lies: its byte range and the offsets of its parts."""

    name: str
    start: int
    end: int
    parts: dict = field(default_factory=dict)  # part name -> offset (u32/u64 fields)


@dataclass
class GGUFLayout:
    """Offsets of a GGUF header's fields (see ``gguf_layout``)."""

    kvs: list[Field]
    tensors: list[Field]
    header_end: int
    data_start: int
    alignment: int


def gguf_layout(buf: bytes) -> GGUFLayout:
    """Map a valid GGUF v3 file's header. Raises ValueError for anything else (it maps the good file
    that is then damaged, not the damaged ones)."""
    if buf[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)

    def string(p):
        n = struct.unpack_from("<Q", buf, p)[0]
        return buf[p + 8:p + 8 + n].decode("utf-8"), p + 8 + n

    kvs, alignment = [], 32
    for _ in range(n_kv):
        start = pos
        key, pos = string(pos)
        parts = {"key_len": start, "type": pos}
        vt = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        if vt == _ARRAY:
            sub, count = struct.unpack_from("<IQ", buf, pos)
            parts.update(sub_type=pos, count=pos + 4)
            pos += 12
            if sub == _STRING:
                if count:
                    parts["first_len"] = pos
                for _ in range(count):
                    pos = string(pos)[1]
            else:
                pos += _FIXED[sub] * count
        elif vt == _STRING:
            parts["str_len"] = pos
            pos = string(pos)[1]
        else:
            if key == "general.alignment":
                alignment = struct.unpack_from("<I", buf, pos)[0]
            parts["value"] = pos
            pos += _FIXED[vt]
        kvs.append(Field(key, start, pos, parts))
    tensors = []
    for _ in range(n_tensors):
        start = pos
        name, pos = string(pos)
        parts = {"name_len": start, "n_dims": pos}
        nd = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        for d in range(nd):
            parts[f"dim{d}"] = pos
            pos += 8
        parts.update(type=pos, offset=pos + 4)
        pos += 12
        tensors.append(Field(name, start, pos, parts))
    data_start = -(-pos // alignment) * alignment
    return GGUFLayout(kvs, tensors, pos, data_start, alignment)


def _put(buf: bytearray, at: int, fmt: str, value: int) -> None:
    struct.pack_into(fmt, buf, at, value & ((1 << (8 * struct.calcsize(fmt))) - 1))


def _rebuilt(buf: bytes, lay: GGUFLayout, header: bytes, n_kv: int, n_tensors: int) -> bytes:
    """A file with ``header`` (the bytes after the counts, up to the tensor infos' end) in place of the
    old one, the counts set, padded to the alignment, then the old data."""
    head = buf[:8] + struct.pack("<QQ", n_tensors, n_kv) + header
    pad = (-len(head)) % lay.alignment
    return head + b"\0" * pad + buf[lay.data_start:]


BIG = [0, 1, 2, 3, 255, 1 << 16, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]


def mutate_gguf(buf: bytes, rng: np.random.Generator, lay: GGUFLayout | None = None) -> tuple[str, bytes]:
    """One damaged copy of the GGUF ``buf`` and a short description of the damage."""
    lay = lay or gguf_layout(buf)
    out = bytearray(buf)
    kind = str(rng.choice(MUTATIONS))
    kv = lay.kvs[int(rng.integers(len(lay.kvs)))] if lay.kvs else None
    t = lay.tensors[int(rng.integers(len(lay.tensors)))] if lay.tensors else None
    big = int(rng.choice(BIG))
    if kind == "truncate":
        cut = int(rng.integers(0, lay.data_start + 64)) if rng.random() < 0.7 else int(rng.integers(0, len(buf)))
        return f"truncate at {cut}", bytes(buf[:cut])
    if kind == "flip_header":
        for _ in range(int(rng.integers(1, 9))):
            at = int(rng.integers(4, lay.header_end))
            out[at] ^= 1 << int(rng.integers(8))
        return "flipped header bits", bytes(out)
    if kind == "flip_data":
        for _ in range(int(rng.integers(1, 65))):
            at = int(rng.integers(lay.data_start, len(buf)))
            out[at] = int(rng.integers(256))
        return "random data bytes", bytes(out)
    if kind == "version":
        _put(out, 4, "<I", int(rng.choice([0, 1, 2, 4, 0xFFFFFFFF])))
        return "version", bytes(out)
    if kind == "n_tensors":
        _put(out, 8, "<Q", int(rng.choice([len(lay.tensors) + 1, max(len(lay.tensors) - 1, 0), big])))
        return "tensor count", bytes(out)
    if kind == "n_kv":
        _put(out, 16, "<Q", int(rng.choice([len(lay.kvs) + 1, max(len(lay.kvs) - 1, 0), big])))
        return "key count", bytes(out)
    if kind == "string_len":
        f = kv if rng.random() < 0.5 or t is None else t
        part = "key_len" if f is kv else "name_len"
        if f is kv and "str_len" in f.parts and rng.random() < 0.5:
            part = "str_len"
        if f is kv and "first_len" in f.parts and rng.random() < 0.3:
            part = "first_len"
        _put(out, f.parts[part], "<Q", big)
        return f"string length of {f.name} ({part}) = {big}", bytes(out)
    if kind == "array_count" and kv is not None and "count" in kv.parts:
        _put(out, kv.parts["count"], "<Q", big)
        return f"array count of {kv.name} = {big}", bytes(out)
    if kind == "value_type" and kv is not None:
        at = kv.parts["sub_type"] if "sub_type" in kv.parts and rng.random() < 0.5 else kv.parts["type"]
        _put(out, at, "<I", int(rng.choice([_ARRAY, _STRING, 6, 10, 13, 99, 0xFFFFFFFF])))
        return f"value type of {kv.name}", bytes(out)
    if kind == "value" and kv is not None and "value" in kv.parts:
        _put(out, kv.parts["value"], "<I", big)
        return f"value of {kv.name} = {big & 0xFFFFFFFF}", bytes(out)
    if kind == "n_dims" and t is not None:
        _put(out, t.parts["n_dims"], "<I", int(rng.choice([0, 3, 4, 5, 255, 0xFFFFFFFF])))
        return f"dims count of {t.name}", bytes(out)
    if kind == "dim" and t is not None:
        d = [k for k in t.parts if k.startswith("dim")]
        if d:
            _put(out, t.parts[str(rng.choice(d))], "<Q", big)
            return f"a dimension of {t.name} = {big}", bytes(out)
    if kind == "tensor_type" and t is not None:
        _put(out, t.parts["type"], "<I", int(rng.choice([2, 8, 12, 14, 4, 5, 39, 41, 99, 0xFFFFFFFF])))
        return f"type of {t.name}", bytes(out)
    if kind == "tensor_offset" and t is not None:
        old = struct.unpack_from("<Q", buf, t.parts["offset"])[0]
        _put(out, t.parts["offset"], "<Q", int(rng.choice([old + 1, old + lay.alignment, len(buf), big])))
        return f"offset of {t.name}", bytes(out)
    header = bytes(buf[24:lay.header_end])
    base = 24
    if kind == "dup_kv" and kv is not None:
        h = header[:kv.end - base] + bytes(buf[kv.start:kv.end]) + header[kv.end - base:]
        return f"key {kv.name} twice", _rebuilt(buf, lay, h, len(lay.kvs) + 1, len(lay.tensors))
    if kind == "drop_kv" and kv is not None:
        want = [f for f in lay.kvs if f.name in ("general.architecture", "tokenizer.ggml.tokens")
                or f.name.endswith((".block_count", ".embedding_length"))]
        kv = want[int(rng.integers(len(want)))] if want and rng.random() < 0.5 else kv
        h = header[:kv.start - base] + header[kv.end - base:]
        return f"key {kv.name} missing", _rebuilt(buf, lay, h, len(lay.kvs) - 1, len(lay.tensors))
    if kind == "dup_tensor" and t is not None:
        h = header[:t.end - base] + bytes(buf[t.start:t.end]) + header[t.end - base:]
        return f"tensor {t.name} twice", _rebuilt(buf, lay, h, len(lay.kvs), len(lay.tensors) + 1)
    if kind == "drop_tensor" and t is not None:
        h = header[:t.start - base] + header[t.end - base:]
        return f"tensor {t.name} missing", _rebuilt(buf, lay, h, len(lay.kvs), len(lay.tensors) - 1)
    cut = int(rng.integers(0, len(buf)))
    return f"truncate at {cut}", bytes(buf[:cut])


MUTATIONS = ("truncate", "flip_header", "flip_data", "version", "n_tensors", "n_kv", "string_len",
             "array_count", "value_type", "value", "n_dims", "dim", "tensor_type", "tensor_offset",
             "dup_kv", "drop_kv", "dup_tensor", "drop_tensor")


CHECKPOINT_MUTATIONS = ("cfg_truncate", "cfg_flip", "cfg_not_json", "cfg_not_object", "cfg_drop", "cfg_value",
                        "st_truncate", "st_flip_header", "st_flip_data", "st_header_len", "st_entry",
                        "st_drop_tensor", "st_extra_tensor", "st_second_file", "st_no_weights")

#: values a config key or a safetensors header field is replaced with
_ODD_VALUES = (None, -1, 0, 1, 2 ** 63, -(2 ** 70), 1e308, 0.5, float("nan"), "7", "", [], [3], {}, True, "x" * 5000)


def _json_paths(obj, prefix=()):
    """Every (path, value) of a JSON document's objects and lists, depth first."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield prefix + (k,), v
        yield from _json_paths(v, prefix + (k,))


def _set_path(obj, path, value, drop: bool = False):
    for k in path[:-1]:
        obj = obj[k]
    if drop:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


def _safetensors_parts(buf: bytes) -> tuple[int, dict]:
    n = struct.unpack_from("<Q", buf, 0)[0]
    return n, json.loads(buf[8:8 + n])


def _safetensors(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def mutate_checkpoint(src: Path, dst: Path, rng: np.random.Generator) -> str:
    """Copy the z-lab checkpoint folder ``src`` (``config.json`` + ``model.safetensors``) to ``dst``
    with one damage; returns what was done. Config damage: truncation, flipped bytes, text that is not
    JSON or not an object, a key dropped or its value replaced by an odd one (``_ODD_VALUES``), nested
    keys included. Weights damage: truncation, flipped header or data bytes, a wrong header length, a
    tensor entry's dtype, shape or data offsets replaced, a tensor dropped, an extra one, a second
    weights file repeating a tensor, no weights at all."""
    import shutil

    shutil.copytree(src, dst)
    cfg_path, st_path = dst / "config.json", dst / "model.safetensors"
    cfg, st = cfg_path.read_bytes(), st_path.read_bytes()
    kind = CHECKPOINT_MUTATIONS[int(rng.integers(len(CHECKPOINT_MUTATIONS)))]
    odd = lambda: _ODD_VALUES[int(rng.integers(len(_ODD_VALUES)))]  # noqa: E731
    if kind == "cfg_truncate":
        cfg_path.write_bytes(cfg[:int(rng.integers(len(cfg)))])
    elif kind == "cfg_flip":
        b = bytearray(cfg)
        for at in rng.integers(0, len(b), size=int(rng.integers(1, 4))):
            b[at] ^= 1 << int(rng.integers(8))
        cfg_path.write_bytes(bytes(b))
    elif kind == "cfg_not_json":
        cfg_path.write_bytes(bytes(rng.integers(0, 256, size=64, dtype=np.uint8)))
    elif kind == "cfg_not_object":
        cfg_path.write_text(json.dumps([json.loads(cfg)]))
    elif kind in ("cfg_drop", "cfg_value"):
        doc = json.loads(cfg)
        paths = [p for p, _ in _json_paths(doc)]
        path = paths[int(rng.integers(len(paths)))]
        value = odd()
        _set_path(doc, path, value, drop=kind == "cfg_drop")
        cfg_path.write_text(json.dumps(doc))
        return f"{kind} {'.'.join(map(str, path))}" + ("" if kind == "cfg_drop" else f" = {str(value)[:20]}")
    elif kind == "st_truncate":
        st_path.write_bytes(st[:int(rng.integers(len(st)))])
    elif kind == "st_flip_header":
        n = struct.unpack_from("<Q", st, 0)[0]
        b = bytearray(st)
        b[int(rng.integers(0, 8 + n))] ^= 1 << int(rng.integers(8))
        st_path.write_bytes(bytes(b))
    elif kind == "st_flip_data":
        n = struct.unpack_from("<Q", st, 0)[0]
        b = bytearray(st)
        for at in rng.integers(8 + n, len(b), size=8):
            b[at] ^= 0xFF
        st_path.write_bytes(bytes(b))
    elif kind == "st_header_len":
        b = bytearray(st)
        lengths = [0, 1, 7, len(st), 2 ** 63, 2 ** 64 - 1]
        struct.pack_into("<Q", b, 0, lengths[int(rng.integers(len(lengths)))])
        st_path.write_bytes(bytes(b))
    else:
        n, header = _safetensors_parts(st)
        data = st[8 + n:]
        names = [k for k in header if k != "__metadata__"]
        name = names[int(rng.integers(len(names)))]
        if kind == "st_entry":
            field_ = ("dtype", "shape", "data_offsets")[int(rng.integers(3))]
            value = odd() if rng.random() < 0.5 else {
                "dtype": lambda: str(rng.choice(["F64", "I8", "U8", "BOOL", "f32", "F8_E4M3"])),
                "shape": lambda: [int(x) for x in rng.integers(-3, 70000, size=int(rng.integers(0, 4)))],
                "data_offsets": lambda: [int(x) for x in rng.integers(-10, len(data) * 2, size=int(rng.integers(0, 4)))],
            }[field_]()
            header[name][field_] = value
            st_path.write_bytes(_safetensors(header, data))
            return f"st_entry {name}.{field_} = {str(value)[:30]}"
        if kind == "st_drop_tensor":
            del header[name]
            st_path.write_bytes(_safetensors(header, data))
        elif kind == "st_extra_tensor":
            header[name + ".extra"] = dict(header[name])
            st_path.write_bytes(_safetensors(header, data))
        elif kind == "st_second_file":
            (dst / "model-2.safetensors").write_bytes(_safetensors({name: header[name]}, data))
        elif kind == "st_no_weights":
            st_path.unlink()
        return f"{kind} {name}"
    return kind


#: kinds converted by ``tfm-convert`` (a failure must leave no file beside the input): ``zlab`` a
#: checkpoint folder, ``requantize`` a drafter GGUF (alone in its folder) written again as Q8_0
CONVERT_KINDS = ("zlab", "requantize")


class PartialOutput(Exception):
    """A failed conversion left files behind (the worker reports it as outcome ``partial``)."""


# -- loading in a child process ------------------------------------------------------------------

def _load(kind: str, path: str, extra: str | None) -> None:
    """Load ``path`` as ``kind`` (see the module doc); raises what the project raises."""
    if kind == "meta":
        from ..files.gguf_meta import read_gguf_meta

        read_gguf_meta(path)
    elif kind == "target":
        from ..decode.verify import Target

        t = Target(path, n_ctx=64, n_threads=1, n_gpu_layers=0)
        try:
            t.prefill([1, 2, 3])
        finally:
            t.close()
    elif kind == "drafter":
        from ..engine import Engine

        with Engine(extra, path, n_ctx=64, n_threads=1, n_gpu_layers=0, budget=4) as e:
            list(e.generate_ids([1, 2, 3], 3, _greedy()))
    elif kind in CONVERT_KINDS:
        from tfm_convert.pipeline import convert_checkpoint

        folder = Path(path) if kind == "zlab" else Path(path).parent
        before = set(os.listdir(folder))
        out = folder / "out.gguf"
        try:
            convert_checkpoint(path, extra, out, "q8_0")
        except Exception as e:
            left = sorted(set(os.listdir(folder)) - before)
            if left:
                raise PartialOutput(f"{type(e).__name__}: {e} (and left {left})") from None
            raise
        out.unlink()
    else:
        raise ValueError(f"unknown kind {kind}")


def _greedy():
    from ..decode.sampling import SamplingParams

    return SamplingParams()


def _worker(kind: str, extra: str | None) -> None:
    """The child: one file path per input line, one JSON answer per output line."""
    while True:
        line = sys.stdin.readline()  # not ``for line in sys.stdin``: that reads ahead and waits
        if not line:
            return
        path = line.rstrip("\n")
        try:
            _load(kind, path, extra)
            ans = {"outcome": "ok"}
        except PartialOutput as e:
            ans = {"outcome": "partial", "message": str(e)[:400]}
        except Exception as e:  # noqa: BLE001 - the point is to report what was raised
            ans = {"outcome": "error", "type": type(e).__name__, "message": str(e)[:400]}
        sys.__stdout__.write("\n" + MARK + json.dumps(ans) + "\n")
        sys.__stdout__.flush()


MARK = "@@fuzz-answer "  # the child's answers, told apart from whatever llama.cpp prints


class LoadWorker:
    """A child process that loads files of one kind (module doc); restarted after a crash or a hang."""

    def __init__(self, kind: str, extra: str | None = None, timeout: float = 30.0):
        self.kind, self.extra, self.timeout = kind, extra, timeout
        self.proc = None

    def _start(self) -> None:
        cmd = [sys.executable, "-m", "tfm_local.testing.fuzz", "--worker", self.kind]
        if self.extra:
            cmd += ["--extra", self.extra]
        env = dict(os.environ, TFM_THREADS="1")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, bufsize=0)
        self._buf = b""

    def load(self, path: str | os.PathLike) -> dict:
        """Load one file; returns {"outcome": ok | error | crash | hang, ...}."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(f"{path}\n".encode())
        import selectors

        end = time.monotonic() + self.timeout
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                while b"\n" in self._buf:  # whole lines first: the answer may already be here
                    line, self._buf = self._buf.split(b"\n", 1)
                    if line.startswith(MARK.encode()):
                        return json.loads(line[len(MARK):])
                if not sel.select(max(end - time.monotonic(), 0)):
                    self.close()
                    return {"outcome": "hang"}
                chunk = os.read(fd, 65536)
                if not chunk:
                    rc = self.proc.wait()
                    self.proc = None
                    return {"outcome": "crash", "returncode": rc}
                self._buf += chunk

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def clear(ans: dict, path: str | os.PathLike) -> bool:
    """An error that names the file (its name or folder) and comes as one of the project's error types
    or a ValueError / OSError subclass, not a bare internal exception."""
    if ans["outcome"] != "error":
        return False
    name = Path(path).name
    internal = {"AssertionError", "KeyError", "IndexError", "TypeError", "AttributeError", "ZeroDivisionError",
                "OverflowError", "MemoryError", "UnicodeDecodeError", "struct.error", "error"}
    return ans["type"] not in internal and name in ans["message"]


def run(kind: str, model: Path, n: int, seed: int, workdir: Path, extra: str | None = None,
        timeout: float = 30.0, time_limit: float | None = None) -> dict:
    """``n`` damaged copies of ``model`` (a GGUF, or for ``zlab`` a checkpoint folder) loaded as
    ``kind``; counts per outcome, and the files that crashed, hung, failed unclearly or left a partial
    output (with their damage)."""
    zlab = kind == "zlab"
    buf = Path(model).read_bytes() if not zlab else b""
    lay = gguf_layout(buf) if not zlab else None
    rng = np.random.default_rng(seed)
    worker = LoadWorker(kind, extra, timeout)
    counts, bad = {}, []
    t0 = time.time()
    try:
        for i in range(n):
            if time_limit is not None and time.time() - t0 > time_limit:
                break
            if zlab:
                path = workdir / f"{kind}-{i}"
                what = mutate_checkpoint(Path(model), path, rng)
            else:
                what, data = mutate_gguf(buf, rng, lay)
                path = workdir / f"{kind}-{i}.gguf"
                if kind == "requantize":  # its own folder: what a failed conversion leaves shows there
                    (workdir / f"{kind}-{i}").mkdir()
                    path = workdir / f"{kind}-{i}" / path.name
                path.write_bytes(data)
            ans = worker.load(path)
            outcome = ans["outcome"]
            if outcome == "error" and not clear(ans, path):
                outcome = "unclear"
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome in ("crash", "hang", "unclear", "partial"):
                bad.append(dict(i=i, damage=what, **ans))
            if kind in CONVERT_KINDS:
                import shutil

                shutil.rmtree(path if zlab else path.parent)
            else:
                path.unlink()
    finally:
        worker.close()
    return dict(kind=kind, seed=seed, files=sum(counts.values()), counts=counts, bad=bad,
                seconds=round(time.time() - t0, 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--extra", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="target", choices=("target", "drafter", "meta") + CONVERT_KINDS)
    ap.add_argument("--model", help="the good GGUF (kind zlab: checkpoint folder) to damage")
    ap.add_argument("--target", help="the good target (kinds drafter, zlab and requantize)")
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the report here (JSON)")
    a = ap.parse_args(argv)
    if a.worker:
        _worker(a.worker, a.extra)
        return 0
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        rep = run(a.kind, Path(a.model), a.n, a.seed, Path(d), a.target)
    print(json.dumps({k: v for k, v in rep.items() if k != "bad"}), file=sys.stderr)
    for b in rep["bad"][:20]:
        print(b, file=sys.stderr)
    if a.out:
        Path(a.out).write_text(json.dumps(rep, indent=1))
    return 0 if not rep["bad"] else 1


if __name__ == "__main__":
    sys.exit(main())
