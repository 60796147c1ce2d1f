"""The demand record and the forecast (slurmk8s/bridge/forecast.py): pure."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from slurmk8s.api.lending import DemandRecord
from slurmk8s.bridge import forecast as F

from .reach import reached, reaches

T0 = datetime(2025, 3, 3, 0, 0, 0, tzinfo=UTC)  # a Monday, midnight


def feed(values, start=T0, step=F.STEP):
    """A record of one value per bucket from ``start``."""
    rec = None
    for i, v in enumerate(values):
        rec = F.record(rec, start + timedelta(seconds=i * step), v)
    return rec


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 200_000)), max_size=F.HISTORY // F.STEP))
def test_the_record_reads_back_as_written(peaks):
    start = int(T0.timestamp())
    rec = F.Record(start, tuple(peaks))
    assert F.decode(*F.encode(rec)) == rec


def test_the_record_is_bounded_at_ten_thousand_nodes_and_fits_at_a_hundred_thousand():
    bound = DemandRecord.model_fields["peaks"].metadata[0].max_length
    rec = F.Record(int(T0.timestamp()), (10_000,) * (F.HISTORY // F.STEP))
    start, peaks = F.encode(rec)
    # The status field's schema bound holds with room to spare (the size the docs quote).
    assert len(peaks) == 8960 and len(peaks) <= bound
    # Five weeks at the most nodes a policy may hold for Kubernetes (minKubernetesNodes' bound).
    most = F.Record(int(T0.timestamp()), (100_000,) * (F.HISTORY // F.STEP))
    assert len(F.encode(most)[1]) == 13440 <= bound


def test_what_does_not_read_as_a_record_is_none():
    assert F.decode("2025-03-03T00:00:00Z", "not base64!") is None
    assert F.decode("yesterday", "AA==") is None
    assert F.decode("2025-03-03T00:00:00Z", "gICAgIA=") is None  # a varint that does not end


def test_a_bucket_keeps_its_peak_and_unseen_buckets_are_unknown():
    rec = F.record(None, T0, 3)
    rec = F.record(rec, T0 + timedelta(seconds=60), 5)
    rec = F.record(rec, T0 + timedelta(seconds=120), 4)
    assert rec.peaks == (5,)
    rec = F.record(rec, T0 + timedelta(seconds=3 * F.STEP + 5), 2)
    assert rec.peaks == (5, None, None, 2)
    same = F.record(rec, T0 + timedelta(seconds=3 * F.STEP + 6), 1)
    assert same is rec  # nothing new: the status is not rewritten


def test_history_is_dropped_past_its_length_and_a_clock_that_went_back_starts_again():
    n = F.HISTORY // F.STEP
    rec = feed(range(n + 10))
    assert len(rec.peaks) == n and rec.peaks[0] == 10
    assert rec.start == int(T0.timestamp()) + 10 * F.STEP
    back = F.record(rec, T0, 7)
    assert back.peaks == (7,)


def test_without_enough_history_the_forecast_does_not_know():
    rec = feed([1, 5, 2])
    assert F.wanted(rec, T0 + timedelta(seconds=3 * F.STEP), 4, (600, 3600), 0.95) == [None, None]
    assert F.wanted(None, T0, 4, (600,), 0.95) == [None]


def test_the_forecast_adds_the_quantile_of_past_rises_and_grows_with_the_horizon():
    # A saw: +1 node per bucket for 4 buckets, then back down; over two days (no time of day yet).
    values = [(i % 8) if i % 8 < 4 else 0 for i in range(2 * 96)]
    rec = feed(values)
    now = T0 + timedelta(seconds=len(values) * F.STEP)
    one, two, long = F.wanted(rec, now, 0, (F.STEP, 2 * F.STEP, 8 * F.STEP), 0.95)
    assert (one, two, long) == (1, 2, 3)
    low = F.wanted(rec, now, 0, (F.STEP,), 0.5)[0]
    assert low <= one


def test_rises_are_read_per_time_of_day_once_three_days_are_recorded():
    # Nights at 2 nodes, days (08:00-18:00) at 10: the rise comes each morning.
    def demand(t):
        hour = (t // 3600) % 24
        return 10 if 8 <= hour < 18 else 2
    days = 5
    values = [demand(i * F.STEP) for i in range(days * 96)]
    rec = feed(values)
    night = T0 + timedelta(days=days, hours=1)      # 01:00: no rise within an hour
    dawn = T0 + timedelta(days=days, hours=7, minutes=30)  # 07:30: the morning within the hour
    assert F.wanted(rec, night, 2, (3600,), 0.95) == [2]
    assert F.wanted(rec, dawn, 2, (3600,), 0.95) == [10]
    # From the night, the morning is within 8 hours.
    assert F.wanted(rec, night, 2, (3600, 4 * 3600, 8 * 3600), 0.95) == [2, 2, 10]
    # Two days of the same record do not show the time of day: the morning's
    # rise then counts at any hour (no period is assumed before it is seen),
    # as the 4% of the hours it is: above the 95th percentile, below the 99th.
    short = feed(values[:2 * 96])
    assert F.wanted(short, T0 + timedelta(days=2, hours=1), 2, (3600,), 0.99) == [10]
    assert F.wanted(short, T0 + timedelta(days=2, hours=1), 2, (3600,), 0.95) == [2]


def test_reserve_horizons_double_from_the_first_to_the_last():
    assert F.reserve_horizons(600, 86400) == (900, 1800, 3600, 7200, 14400, 28800, 57600, 86400)
    assert F.reserve_horizons(3600, 3600) == (3600,)


def test_demand_counts_busy_nodes_and_the_nodes_pending_gpus_fill():
    assert F.demand_now(3, 0, 8) == 3
    assert F.demand_now(3, 9, 8) == 5
    assert F.demand_now(0, 1, 0) == 0
    assert math.isclose(F.STEP * (F.HISTORY // F.STEP), F.HISTORY)


def _naive_rises(closed, start_bucket, tod, daily, h):
    """The rises by their definition, one window at a time."""
    out = []
    for i, v in enumerate(closed):
        if v is None or i + h >= len(closed):
            continue
        if daily:
            d = abs((start_bucket + i) % (86400 // F.STEP) - tod)
            if min(d, 86400 // F.STEP - d) > 3600 // F.STEP:
                continue
        known = [x for x in closed[i + 1:i + h + 1] if x is not None]
        if known:
            out.append(max(0, max(known) - v))
    return out


@reaches(known=0.2)
@settings(max_examples=150, deadline=None)
@given(st.one_of(st.lists(st.one_of(st.none(), st.integers(0, 40)), min_size=1, max_size=600),
                 # long enough for a quantile, now and then with a day's gap
                 st.lists(st.one_of(st.integers(0, 40), st.integers(0, 40), st.none()), min_size=40, max_size=600)),
       st.one_of(st.lists(st.integers(1, 200 * F.STEP), min_size=1, max_size=5),
                 st.lists(st.integers(1, 8 * F.STEP), min_size=1, max_size=3)).map(lambda hs: tuple(sorted(hs))),
       st.sampled_from([0.5, 0.9, 0.95, 1.0]), st.integers(0, 95))
def test_the_quantiles_are_those_of_the_rises_by_their_definition(peaks, horizons, q, offset):
    start = int(T0.timestamp()) + offset * F.STEP
    rec = F.Record(start, tuple(peaks))
    now_bucket = rec.end
    got = F.rise_quantiles(rec, now_bucket, horizons, q)
    daily = len(peaks) - peaks.count(None) >= F.DAILY_AFTER // F.STEP
    tod = (now_bucket // F.STEP) % (86400 // F.STEP)
    want, best = [], None
    for horizon in horizons:
        rises = sorted(_naive_rises(peaks, start // F.STEP, tod, daily, max(1, math.ceil(horizon / F.STEP))))
        v = rises[min(len(rises) - 1, max(0, math.ceil(q * len(rises)) - 1))] if len(rises) >= F.MIN_SAMPLES else None
        if v is not None:
            best = v if best is None else max(best, v)
        want.append(best if v is not None else None)
    if best is not None:
        reached("known")
    assert list(got) == want


def test_the_forecast_starts_from_the_recent_peak_not_from_a_moment_of_it():
    # Rises are measured peak to peak: a dip of the demand between two
    # peaks does not lower what is wanted next.
    values = [4, 6] * 96  # two days, each bucket's peak 4 or 6
    rec = feed(values)
    now = T0 + timedelta(seconds=len(values) * F.STEP + 60)
    rec = F.record(rec, now, 2)  # the demand this minute: 2
    one = F.wanted(rec, now, 2, (F.STEP,), 0.95)[0]
    assert one == 6 + 2  # the last bucket's peak, 6, and a rise of 2 (4 -> 6)
    # Too short a record: not known.
    assert F.wanted(feed([6, 4]), T0 + timedelta(seconds=2 * F.STEP), 2, (F.STEP,), 0.95) == [None]


def _evening(days, *, night=2, peak=10, quiet_today=None):
    """Per bucket: ``night`` nodes but from 19:00 to 21:00, ``peak``; the
    last day's night ``quiet_today`` if given."""
    out = []
    for i in range(days * 96):
        hour = (i // 4) % 24
        low = quiet_today if quiet_today is not None and i >= (days - 1) * 96 else night
        out.append(peak if 19 <= hour < 21 else low)
    return out


def test_the_same_time_of_day_keeps_the_evening_peak_while_the_night_is_quieter():
    # Five days of nights at 4 and evenings at 10; tonight has been at 1 since midnight.
    values = _evening(5, night=4) + [1] * (4 * 4)
    rec = feed(values)
    now = T0 + timedelta(days=5, hours=4)
    horizons = (3600, 8 * 3600, 16 * 3600)
    # The recent answer measures the evening's rise (6) from tonight's low peak: 7.
    assert F.wanted(rec, now, 1, horizons, 0.95) == [1, 1, 7]
    # The same time of day on past days: their nights' 4, their evenings' 10 within 16 hours, and
    # which answer gave it.
    told = F.explained(rec, now, 1, horizons, 0.95, days=7, weeks=0)
    assert told == [(4, F.DAILY), (4, F.DAILY), (10, F.DAILY)]
    # Fewer than three days at this time of day: the daily answer is not given.
    short = feed(_evening(2, night=4) + [1] * 16)
    assert F.explained(short, T0 + timedelta(days=2, hours=4), 1, (16 * 3600,), 0.95, days=7)[0][1] != F.DAILY


def test_the_same_time_of_the_week_keeps_a_peak_only_one_weekday_has():
    # Two weeks of a daily cycle (2 nodes until 06:00, then 4), and every Monday from 09:00 to 11:00 12.
    values = [12 if i % (7 * 96) in range(36, 44) else (2 if i % 96 < 24 else 4) for i in range(14 * 96)]
    rec = feed(values)
    monday = T0 + timedelta(days=14, hours=6)  # a Monday, 06:00
    # Six hours ahead: the daily answer is the median of seven days of which one is a Monday: 4, as the
    # recent peak and its rise say.
    assert F.explained(rec, monday, 2, (6 * 3600,), 0.5, days=7, weeks=0) == [(4, F.RECENT)]
    assert F.explained(rec, monday, 2, (6 * 3600,), 0.5, days=7, weeks=2) == [(12, F.WEEKLY)]
    # On a Tuesday the weeks before show no more than the days before.
    assert F.explained(rec, monday + timedelta(days=1), 2, (6 * 3600,), 0.5, days=7, weeks=2) == [(4, F.DAILY)]


def test_a_seasonal_window_counts_when_recorded_and_half_known():
    start = int(T0.timestamp())
    day = 86400 // F.STEP
    cycle = [1 if b < day // 2 else 3 for b in range(day)]  # nights at 1, days at 3
    # Five days: two known, the night known with a peak of 9 at 02:30 and the day unknown, one known, and
    # the day now (02:00) is in.
    night = [9 if b == 10 else 1 for b in range(day // 2)]
    peaks = cycle * 2 + night + [None] * (day // 2) + cycle + [1] * 8
    rec = F.Record(start, tuple(peaks))
    now = start + F.STEP * len(peaks)
    levels = F.seasonal_levels(rec, now, (3600,), 1.0, 7, 0)
    # Windows 1, 3 and 4 days back: 1; 2 days back falls in the known night, at 9.
    assert levels == ((9, F.DAILY),)
    rec = F.Record(start, tuple(peaks[:2 * day] + [None] * day + peaks[3 * day:]))
    # A window that is all unknown does not count: then the windows 1, 3 and 4 days back say 1.
    assert F.seasonal_levels(rec, now, (3600,), 1.0, 7, 0) == ((1, F.DAILY),)
    rec = F.Record(start, tuple(peaks[:day] + [None] * 2 * day + peaks[3 * day:]))
    # Two known days are too few.
    assert F.seasonal_levels(rec, now, (3600,), 1.0, 7, 0) == ((None, None),)


def test_the_seasonal_answer_counts_only_where_the_days_repeat():
    day = 86400 // F.STEP
    cycle = [2] * (day // 4) + [8] * (day // 4) + [4] * (day // 2)
    assert F.daily_strength(cycle * 5, 7) > 0.99
    # A level that shifts from day to day is no cycle; nor is a wave that does not repeat daily.
    assert F.daily_strength([d for d in (2, 6, 3, 9, 4) for _ in range(day)], 7) == 0
    wave = [round(5 + 4 * math.sin(2 * math.pi * i / (day * 3.3))) for i in range(5 * day)]
    assert F.daily_strength(wave, 7) < F.SEASONAL_STRENGTH
    assert F.daily_strength(cycle * 2, 7) == 0  # fewer than three days
    # Below the bar, the forecast is the recent answer alone, even where past days were higher.
    rec = feed(wave)
    now = T0 + timedelta(seconds=F.STEP * len(wave))
    assert F.seasonal_levels(rec, int(now.timestamp()), (3600, 86400), 0.95, 7, 4) == ((None, None),) * 2
    rec = feed(cycle * 5)
    assert F.seasonal_levels(rec, int(now.timestamp()), (3600, 86400), 0.95, 7, 4)[1] == (8, F.DAILY)


def test_rises_older_than_the_rise_history_do_not_count():
    quiet = [0] * (F.RISE_HISTORY // F.STEP)
    saw = [0, 9] * 48  # a day of rises of 9, then two quiet weeks
    rec = feed(saw + quiet)
    now = T0 + timedelta(seconds=F.STEP * len(rec.peaks))
    assert F.wanted(rec, now, 0, (F.STEP,), 0.95) == [0]
    assert F.wanted(feed(saw + quiet[:-96]), now - timedelta(days=1), 0, (F.STEP,), 1.0) == [9]


def test_without_the_seasonal_answers_the_forecast_is_that_of_a_fourteen_day_record():
    """The record keeps five weeks; the recent answer reads what the record
    of 14 days held (the bucket now in among them), so that a forecast
    without seasonal answers decides as before."""
    n = F.RISE_HISTORY // F.STEP
    values = [1] * (20 * 96)
    # A rise of 9 from the bucket just before the 14 days (with the one now in): not theirs.
    values[-n - 1], values[-n] = 0, 9
    now = T0 + timedelta(seconds=F.STEP * (len(values) - 1) + 60)  # in the last bucket
    long = feed(values)
    short = F.Record(long.start + F.STEP * (len(long.peaks) - n), long.peaks[-n:])
    horizons = (600, 3600, 4 * 3600, 86400, 3 * 86400)
    for q in (0.5, 1.0):
        assert F.wanted(long, now, 1, horizons, q) == F.wanted(short, now, 1, horizons, q)
    assert F.wanted(long, now, 1, (600,), 1.0) == [1]
