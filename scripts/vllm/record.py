"""Records the payloads vLLM puts on the wire into testdata/vllm/<version>/.

    usage: bash scripts/vllm/record.sh        (installs vLLM, writes a model, runs this)
           python record.py --model DIR --out testdata/vllm [--no-serve]

Run it with the Python of scripts/vllm/install.sh's environment. Every file it
writes is listed in manifest.json with its provenance:

  recorded       taken from a running `vllm serve` (HTTP answers, /metrics,
                 KV-event batches read off its ZMQ publisher);
  vllm-code      produced by calling vLLM's own code in this process (its
                 msgspec event types encoded by msgspec, its NIXL connector's
                 scheduler-side request_finished), no engine running;
  reconstructed  vLLM's types re-declared with one option changed, to keep the
                 older wire form (array_like events) that vLLM no longer emits.

It also decodes, with vLLM's own KVEventBatch decoder, the batches Tandem
encodes (testdata/vllm/tandem/*.msgpack, written by the Go test with
-update) and records the verdict in tandem-decoded.json.

Re-running it against a newer vLLM writes a new version directory; a diff
between the two shows what changed on the wire.
"""

import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import msgspec  # noqa: E402
import vllm  # noqa: E402
import zmq  # noqa: E402
from vllm.distributed import kv_events as ke  # noqa: E402

manifest = {}


def write(out, rel, data, provenance, what):
    path = os.path.join(out, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as f:
        f.write(data)
    manifest[rel] = {"provenance": provenance, "what": what}


def jdump(v):
    return json.dumps(v, indent=2, sort_keys=True, default=list) + "\n"


def describe_batch(payload, batch_type=None):
    """The batch as vLLM's own decoder (or batch_type's) sees it, in plain JSON."""
    b = msgspec.msgpack.Decoder(batch_type or ke.KVEventBatch).decode(payload)
    out = {"ts": b.ts, "data_parallel_rank": b.data_parallel_rank, "events": []}
    for e in b.events:
        d = {"type": type(e).__name__}
        for f in msgspec.structs.fields(type(e)):
            v = getattr(e, f.name)
            if isinstance(v, bytes):
                v = v.hex()
            elif isinstance(v, list):
                v = [x.hex() if isinstance(x, bytes) else x for x in v]
            d[f.name] = v
        out["events"].append(d)
    return out


# ---------------------------------------------------------------- KV events


def array_like_types():
    """vLLM's event structs re-declared array_like, as vLLM published them
    before it switched its events to maps: same fields, same order."""

    def clone(cls):
        fields = [(f.name, f.type, f.default) if f.default is not msgspec.NODEFAULT else (f.name, f.type)
                  for f in msgspec.structs.fields(cls)]
        return msgspec.defstruct(cls.__name__, fields, array_like=True, omit_defaults=True, tag=True)

    return clone(ke.BlockStored), clone(ke.BlockRemoved), clone(ke.AllBlocksCleared)


def array_like_batch(types):
    """KVEventBatch over the array_like event types."""
    import typing
    return msgspec.defstruct("KVEventBatch", [("ts", float), ("events", list[typing.Union[types]]),
                                              ("data_parallel_rank", typing.Optional[int], None)],
                             array_like=True, omit_defaults=True)


def event_cases():
    """Event batches built with vLLM's own types: the fields Tandem publishes,
    and the newer optional ones (group_idx, cache-spec kind, LoRA, extra keys,
    locality) that a consumer must skip or read."""
    h = [0x1234, 0xFEDCBA9876543210, 7]  # one hash past int64
    toks = list(range(1, 9))
    return {
        "basic": dict(ts=1700000000.5, rank=0, events=[
            ("BlockStored", dict(block_hashes=h[:2], parent_block_hash=None, token_ids=toks, block_size=4,
                                 lora_id=None, medium="GPU", lora_name=None)),
            ("BlockStored", dict(block_hashes=h[2:], parent_block_hash=h[1], token_ids=toks[:4], block_size=4,
                                 lora_id=None, medium="GPU", lora_name=None)),
            ("BlockRemoved", dict(block_hashes=h[:1], medium="GPU")),
            ("AllBlocksCleared", {}),
        ]),
        "newer-fields": dict(ts=1700000001.25, rank=1, events=[
            ("BlockStored", dict(block_hashes=h[:1], parent_block_hash=h[2], token_ids=toks[:4], block_size=4,
                                 lora_id=3, medium="CPU", lora_name="adapter-a",
                                 extra_keys=[("adapter-a", ("mm-1", 0), "salt")], group_idx=1,
                                 kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128,
                                 locality="LOCAL", ownership="tier-2", session_id="s-1")),
            ("BlockRemoved", dict(block_hashes=h[1:2], medium=None, group_idx=1, locality="REMOTE",
                                  ownership="tier-2")),
        ]),
        "no-rank": dict(ts=1700000002.0, rank=None, events=[
            ("BlockStored", dict(block_hashes=[1], parent_block_hash=None, token_ids=[5, 6], block_size=2,
                                 lora_id=None, medium=None, lora_name=None)),
        ]),
        "bytes-hashes": dict(ts=1700000003.0, rank=0, events=[
            ("BlockStored", dict(block_hashes=[bytes(range(32)), b"\x01\x02"], parent_block_hash=bytes(range(32, 64)),
                                 token_ids=[1, 2, 3, 4], block_size=2, lora_id=None, medium="GPU", lora_name=None)),
            ("BlockRemoved", dict(block_hashes=[bytes(range(32))], medium="GPU")),
        ]),
    }


def record_event_encodings(out):
    enc = msgspec.msgpack.Encoder()
    new_types = {"BlockStored": ke.BlockStored, "BlockRemoved": ke.BlockRemoved,
                 "AllBlocksCleared": ke.AllBlocksCleared}
    old_types = array_like_types()
    old = dict(zip(["BlockStored", "BlockRemoved", "AllBlocksCleared"], old_types))
    old_batch = array_like_batch(old_types)
    for name, case in event_cases().items():
        for form, types, prov in (("map", new_types, "vllm-code"), ("array", old, "reconstructed")):
            events = [types[t](**kw) for t, kw in case["events"]]
            batch = ke.KVEventBatch(ts=case["ts"], events=events, data_parallel_rank=case["rank"]) if form == "map" \
                else ke.EventBatch(ts=case["ts"], events=events, data_parallel_rank=case["rank"])
            payload = enc.encode(batch)
            rel = f"kvevents/{form}-{name}.msgpack"
            what = f"KVEventBatch '{name}', events as {'maps (vLLM now)' if form == 'map' else 'arrays (vLLM before its switch to maps)'}"
            write(out, rel, payload, prov, what)
            write(out, rel.replace(".msgpack", ".json"),
                  jdump(describe_batch(payload, None if form == "map" else old_batch)), prov,
                  f"{rel} as vLLM's decoder reads it")


def record_tandem_decoding(out, tandem_dir):
    """vLLM's decoders over the batches Tandem publishes: its KVEventBatch as
    it is now (events as maps), and its types re-declared array_like (events
    as arrays, as vLLM published them before)."""
    import hashlib

    old_batch = array_like_batch(array_like_types())
    verdicts = {}
    for path in sorted(glob.glob(os.path.join(tandem_dir, "*.msgpack"))):
        payload = open(path, "rb").read()
        v = {"sha256": hashlib.sha256(payload).hexdigest()}
        for key, batch_type in (("vllm", None), ("array_form", old_batch)):
            try:
                v[key] = {"accepted": True, "error": "", "decoded": describe_batch(payload, batch_type)}
            except (msgspec.ValidationError, msgspec.DecodeError) as e:
                v[key] = {"accepted": False, "error": f"{type(e).__name__}: {e}"}
        verdicts[os.path.basename(path)] = v
    if verdicts:
        write(out, "tandem-decoded.json", jdump(verdicts), "vllm-code",
              "vLLM's KVEventBatch decoder (and its array-form twin) run over testdata/vllm/tandem/*.msgpack")


# ---------------------------------------------------------------- kv_transfer_params


def record_kv_transfer_params(out, model):
    """kv_transfer_params as the NIXL connector's scheduler side returns them
    from request_finished, on a connector built from a real VllmConfig."""
    import types as pytypes

    import torch
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import NixlPullConnectorScheduler
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import RequestStatus

    cfg = EngineArgs(model=model, enforce_eager=True, dtype="bfloat16", max_model_len=2048,
                     kv_transfer_config=KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both",
                                                         kv_connector_extra_config={"bidirectional_kv_xfer": True}),
                     ).create_engine_config()
    spec = FullAttentionSpec(block_size=cfg.cache_config.block_size, num_kv_heads=3, head_size=64, dtype=torch.bfloat16)
    kvc = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(layer_names=["model.layers.0.self_attn.attn"], kv_cache_spec=spec)])

    def finish(engine_id, req_id, params, status, blocks, computed):
        s = NixlPullConnectorScheduler(cfg, engine_id, kvc)
        req = pytypes.SimpleNamespace(request_id=req_id, status=status, num_computed_tokens=computed,
                                      kv_transfer_params=params)
        delay, got = s.request_finished(req, blocks)
        return {"request_kv_transfer_params": params, "delay_free_blocks": delay,
                "kv_transfer_params": json.loads(json.dumps(got, default=list))}

    proxy_to_p = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}
    cases = {
        "prefill-finished": finish("prefill-engine-0", "cmpl-6f1d-0-1a2b3c4d", dict(proxy_to_p),
                                   RequestStatus.FINISHED_LENGTH_CAPPED, ([1, 2, 3],), 300),
        "prefill-aborted": finish("prefill-engine-0", "cmpl-6f1d-0-1a2b3c4d", dict(proxy_to_p),
                                  RequestStatus.FINISHED_ABORTED, ([1, 2, 3],), 300),
        # D in bidirectional mode, after its pull: do_remote_prefill was
        # flipped to false by the connector when it allocated.
        "decode-bidirectional": finish("decode-engine-0", "cmpl-6f1d-0-5e6f7a8b",
                                       {"do_remote_prefill": False, "do_remote_decode": False,
                                        "remote_engine_id": "prefill-engine-0", "remote_block_ids": [[1, 2, 3]],
                                        "remote_request_id": "cmpl-6f1d-0-1a2b3c4d", "remote_host": "localhost",
                                        "remote_port": 5600, "tp_size": 1},
                                       RequestStatus.FINISHED_STOPPED, ([7, 8, 9, 10],), 310),
    }
    for name, c in cases.items():
        write(out, f"kvparams/{name}.json", jdump(c), "vllm-code",
              f"NixlPullConnectorScheduler.request_finished ({name}); block size {cfg.cache_config.block_size}")


# ---------------------------------------------------------------- live engine


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, content_type="application/json", method=None):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if content_type and data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def record_live(out, model, vllm_bin):
    port, ev_port = free_port(), free_port()
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_SERVER_DEV_MODE="1")
    kv_events = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv",
                 "endpoint": f"tcp://127.0.0.1:{ev_port}"}
    cmd = [vllm_bin, "serve", model, "--enforce-eager", "--dtype", "bfloat16", "--port", str(port),
           "--host", "127.0.0.1", "--max-model-len", "2048", "--served-model-name", "tiny",
           "--block-size", "32", "--kv-events-config", json.dumps(kv_events)]
    log = open(os.path.join(tempfile.gettempdir(), f"tandem-record-vllm-{vllm.__version__}.log"), "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    # vLLM's publisher connects to a non-wildcard tcp endpoint (it binds only
    # tcp://*:PORT, ipc:// and inproc://), so the subscriber binds here.
    sub.bind(f"tcp://127.0.0.1:{ev_port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    batches, stop = [], threading.Event()

    def listen():
        while not stop.is_set():
            if sub.poll(200):
                batches.append(sub.recv_multipart())

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"vllm serve exited with {proc.returncode}; see {log.name}")
            try:
                if http(base + "/health", method="GET")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"vllm serve not healthy after 600 s; see {log.name}")
            time.sleep(1)

        prompt = " ".join(f"word{i}" for i in range(40))
        req = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}
        answers = {}
        for i in range(2):  # the second run hits the prefix cache
            st, body = http(base + "/v1/completions", req)
            answers[f"completion-{i}"] = {"status": st, "body": json.loads(body)}
        st, body = http(base + "/reset_prefix_cache", b"", method="POST")
        answers["reset_prefix_cache"] = {"status": st}
        # The reset queues AllBlocksCleared; the scheduler publishes queued
        # events in its next step, which this request makes happen.
        st, body = http(base + "/v1/completions", req)
        answers["completion-after-reset"] = {"status": st, "body": json.loads(body)}
        write(out, "http/completions.json", jdump({"request": req, "answers": answers}), "recorded",
              "two greedy completions of the same prompt, a prefix-cache reset (AllBlocksCleared), the prompt again")

        errors = {
            "unknown-model": ({"model": "nope", "prompt": "hi", "max_tokens": 1}, "application/json"),
            "negative-max-tokens": ({"model": "tiny", "prompt": "hi", "max_tokens": -1}, "application/json"),
            "bad-json": (b'{"model": "tiny", "prompt": ', "application/json"),
            "text-plain": (json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 1}).encode(), "text/plain"),
            "invalid-utf8": (b'{"model": "tiny", "prompt": "\xff\xfe", "max_tokens": 1}', "application/json"),
            "prompt-too-long": ({"model": "tiny", "prompt": [1] * 3000, "max_tokens": 1}, "application/json"),
        }
        for name, (body, ctype) in errors.items():
            st, got = http(base + "/v1/completions", body, content_type=ctype)
            try:
                parsed = json.loads(got)
            except ValueError:
                parsed = got.decode("utf-8", "replace")
            sent = body if isinstance(body, dict) else body.decode("utf-8", "backslashreplace")
            write(out, f"errors/{name}.json", jdump({"content_type": ctype, "request": sent, "status": st,
                                                     "body": parsed}),
                  "recorded", f"POST /v1/completions ({name})")

        time.sleep(2)  # let the publisher thread flush the last steps' batches
        st, metrics = http(base + "/metrics", method="GET")
        write(out, "metrics.txt", metrics.decode(), "recorded", "GET /metrics after the completions above")
    finally:
        stop.set()
        t.join()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        sub.close(0)
        ctx.term()
        log.close()
    n = 0
    for frames in batches:
        if len(frames) != 3:
            continue
        topic, seq, payload = frames
        write(out, f"kvevents/live-{n:03d}.msgpack", payload, "recorded",
              f"KV-event batch {int.from_bytes(seq, 'big', signed=True)} off the ZMQ publisher (topic {topic.decode()})")
        write(out, f"kvevents/live-{n:03d}.json", jdump(describe_batch(payload)), "recorded",
              f"kvevents/live-{n:03d}.msgpack as vLLM's decoder reads it")
        n += 1
    if n == 0:
        raise SystemExit("vllm serve published no KV-event batch")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="an HF-layout model directory (tandem model init)")
    ap.add_argument("--out", required=True, help="the testdata/vllm directory")
    ap.add_argument("--no-serve", action="store_true", help="skip what needs a running vllm serve")
    args = ap.parse_args()
    out = os.path.join(args.out, vllm.__version__)
    os.makedirs(out, exist_ok=True)
    # --no-serve keeps what an earlier run recorded from a running engine.
    keep = set()
    if args.no_serve and os.path.exists(os.path.join(out, "manifest.json")):
        old_files = json.load(open(os.path.join(out, "manifest.json")))["files"]
        keep = {rel for rel, m in old_files.items() if m["provenance"] == "recorded"}
        manifest.update({rel: old_files[rel] for rel in keep})
    for old in glob.glob(os.path.join(out, "**", "*"), recursive=True):
        if os.path.isfile(old) and os.path.relpath(old, out) not in keep:
            os.remove(old)
    record_event_encodings(out)
    record_tandem_decoding(out, os.path.join(args.out, "tandem"))
    record_kv_transfer_params(out, args.model)
    if not args.no_serve:
        vllm_bin = os.path.join(os.path.dirname(sys.executable), "vllm")
        record_live(out, args.model, vllm_bin)
    import torch
    write(out, "manifest.json", jdump({
        "vllm": vllm.__version__, "torch": torch.__version__, "msgspec": msgspec.__version__,
        "files": dict(sorted(manifest.items())),
    }), "vllm-code", "this list")
    print(f"record: wrote {len(manifest)} files to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
