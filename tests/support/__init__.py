"""What the tests share: generated inputs, user functions, oracles, operators driven by
hand and what they keep on disk, the test jobs' pipelines, driving and pacing jobs, a
checkpoint coordinator by hand, the TTL model, and the per-test deadline. One module per
concern; test modules import from here, never from each other (tests/test_support.py
tests what no test exercises on its own)."""
