"""ChannelMute on a real event loop with short deadlines: pause once, extend, never shorten, resume once."""

import asyncio

from mute import ChannelMute


def _run(coro):
    return asyncio.run(coro)


def test_pause_then_resume_after_deadline():
    async def main():
        loop = asyncio.get_running_loop()
        events = []
        m = ChannelMute(loop, lambda: events.append(("pause", loop.time())),
                        lambda: events.append(("resume", loop.time())))
        t0 = loop.time()
        m.mute_for(0.05)
        assert m.muted and events[0][0] == "pause"
        await asyncio.sleep(0.1)
        assert not m.muted
        assert [e[0] for e in events] == ["pause", "resume"]
        assert events[1][1] - t0 >= 0.05
    _run(main())


def test_longer_deadline_extends_shorter_is_ignored():
    async def main():
        loop = asyncio.get_running_loop()
        events = []
        m = ChannelMute(loop, lambda: events.append("pause"), lambda: events.append("resume"))
        m.mute_for(0.05)
        m.mute_for(0.15)
        until = m.until
        m.mute_for(0.01)
        assert m.until == until
        await asyncio.sleep(0.08)
        assert events == ["pause"]  # still muted: extended
        await asyncio.sleep(0.12)
        assert events == ["pause", "resume"]
    _run(main())


def test_zero_or_past_deadline_does_nothing_and_cancel_never_resumes():
    async def main():
        loop = asyncio.get_running_loop()
        events = []
        m = ChannelMute(loop, lambda: events.append("pause"), lambda: events.append("resume"))
        m.mute_for(0)
        m.mute_until(loop.time() - 1)
        assert events == [] and not m.muted
        m.mute_for(0.02)
        m.cancel()
        await asyncio.sleep(0.05)
        assert events == ["pause"]
    _run(main())
