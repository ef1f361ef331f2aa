"""ChannelMute on a real event loop with short deadlines: pause once, extend, never shorten, resume once."""

import asyncio

from mute import ChannelMute


def _run(coro):
    return asyncio.run(coro)


def test_pause_then_resume_after_deadline():
    async def main():
        loop = asyncio.get_running_loop()
        events = []
        m = ChannelMute(
            loop, lambda: events.append(("pause", loop.time())), lambda _ended: events.append(("resume", loop.time()))
        )
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
        m = ChannelMute(loop, lambda: events.append("pause"), lambda _ended: events.append("resume"))
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
        m = ChannelMute(loop, lambda: events.append("pause"), lambda _ended: events.append("resume"))
        m.mute_for(0)
        m.mute_until(loop.time() - 1)
        assert events == [] and not m.muted
        m.mute_for(0.02)
        m.cancel()
        await asyncio.sleep(0.05)
        assert events == ["pause"]

    _run(main())


def _recorder(loop, events):
    return ChannelMute(
        loop, lambda: events.append(("pause", loop.time())), lambda ended: events.append(("resume", ended, loop.time()))
    )


def test_hold_stops_reading_until_served_then_mutes_from_that_moment():
    async def main():
        loop = asyncio.get_running_loop()
        events = []
        m = _recorder(loop, events)
        m.hold()
        m.hold()
        assert m.held and [e[0] for e in events] == ["pause"]
        await asyncio.sleep(0.05)  # however long the response takes, nothing is read
        assert len(events) == 1
        served_at = loop.time()
        m.served(0.05)
        assert not m.held
        await asyncio.sleep(0.1)
        assert [e[0] for e in events] == ["pause", "resume"] and events[1][1] is True
        assert events[1][2] - served_at >= 0.05

    _run(main())


def test_hold_served_with_no_throttle_resumes_at_once_and_says_the_hold_ended():
    async def main():
        loop = asyncio.get_running_loop()
        events = []
        m = _recorder(loop, events)
        m.hold()
        m.served(0)
        assert [e[:2] for e in events] == [("pause", events[0][1]), ("resume", True)]

    _run(main())


def test_mute_expiring_during_a_hold_does_not_resume_and_longest_wins():
    async def main():
        loop = asyncio.get_running_loop()
        events = []
        m = _recorder(loop, events)
        m.mute_for(0.02)
        m.hold()
        await asyncio.sleep(0.05)
        assert [e[0] for e in events] == ["pause"]  # the mute ran out, the hold did not
        m.mute_for(0.15)
        t = loop.time()
        m.served(0.01)  # the longer mute still wins
        await asyncio.sleep(0.05)
        assert [e[0] for e in events] == ["pause"]
        await asyncio.sleep(0.15)
        assert [e[:2] for e in events][1] == ("resume", True)
        assert events[1][2] - t >= 0.1

    _run(main())
