"""What the tests share: pacing of jobs, waiting on jobs, failure injection, the per-test
deadline, and the Kafka broker. One module per concern, each tested once
(tests/test_support.py); test modules import from here, never from each other."""
