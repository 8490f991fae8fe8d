"""The simulator's streaming hot path: byte-template chunks, direct socket writes, the kernel timer."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
from aiohttp import web

from tests.util import free_port
from workers.sim import chunks, text
from workers.sim.timing import PreciseTimer


def _slow_generate_obj(pieces: list[int], upto: int, rid: str, prompt: int, cached: int) -> dict:
    """What ``SimServer._generate_obj`` builds for a non-final chunk (the shape SGLang streams)."""
    return {
        "text": "".join(text.VOCAB[p] for p in pieces[:upto]),
        "output_ids": [text.token_id(p) for p in pieces[:upto]],
        "meta_info": {
            "id": rid,
            "finish_reason": None,
            "prompt_tokens": prompt,
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": upto,
            "cached_tokens": cached,
            "cached_tokens_details": None,
        },
    }


def test_generate_template_matches_the_json_object_key_for_key() -> None:
    pieces = [*text.sample_pieces(random.Random(3), 40), text.GARBAGE_ID]
    fmt = chunks.GenerateFormat('r"1', prompt_tokens=12, cached_tokens=11)
    for upto in (1, 2, 5, 5, 17, 41):  # repeated and multi-token steps (speculative chunks)
        raw = fmt.chunk(pieces, upto, chunks.sim_fields(1.5, 2.25, 3.125))
        assert raw.startswith(b"data: {") and raw.endswith(b"}\n\n")
        obj = json.loads(raw[6:])
        want = _slow_generate_obj(pieces, upto, 'r"1', 12, 11)
        want.update({"sim_t_recv": 1.5, "sim_t_sched": 2.25, "sim_t_emit": 3.125})
        assert obj == want and list(obj) == list(want) and list(obj["meta_info"]) == list(want["meta_info"])
    batch = json.loads(chunks.GenerateFormat("b", 3, 0, index=2).chunk(pieces, 3)[6:])
    assert batch["index"] == 2 and batch["meta_info"]["completion_tokens"] == 3 and "sim_t_emit" not in batch


def test_socket_writer_chunks_interleave_with_aiohttp_writes() -> None:
    refused: list[bool] = []

    async def main() -> tuple[bytes, str]:
        async def handler(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"")
            sock = chunks.SocketWriter(request.transport)
            assert sock.ready()
            sock.send(b"data: 1\n\n")
            sock.busy = True  # the handler is writing: the tick must not overtake it
            refused.append(not sock.ready())
            sock.busy = False
            await resp.write(b"data: 2\n\n")
            sock.send(b"data: 3\n\n")
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_get("/s", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/s") as r:
                body = await r.read()
                return body, r.headers.get("Transfer-Encoding", "")
        finally:
            await runner.cleanup()

    body, encoding = asyncio.run(main())
    assert encoding == "chunked" and refused == [True]
    assert body == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"


def test_precise_timer_is_never_early_and_can_be_cancelled() -> None:
    async def main() -> tuple[list[float], list[float], bool]:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        timer = PreciseTimer(loop, lambda: fired.append(time.time()))
        lateness = []
        for _ in range(20):
            target = time.time() + 0.002
            timer.arm(target)
            while len(fired) <= len(lateness):
                await asyncio.sleep(0.0005)
            lateness.append(fired[-1] - target)
        timer.arm(time.time() + 0.01)
        timer.arm(time.time() + 0.02)  # re-arming replaces the earlier deadline
        timer.cancel()
        await asyncio.sleep(0.04)
        kernel = timer.kernel_timer
        timer.close()
        return lateness, fired, kernel

    lateness, fired, kernel = asyncio.run(main())
    assert len(fired) == 20  # the cancelled arming never fired
    assert min(lateness) >= 0
    assert sorted(lateness)[10] < 0.005 and kernel  # median wake-up well under the loop's 1 ms timer grain
