"""Benchmark question files and their records: :mod:`.qarecord` (one question), :mod:`.qafiles`
(MetaQA text, JSONL and Parquet question files), :mod:`.benchmarks` (WebQSP, CWQ, GrailQA and
GraphQuestions as published), :mod:`.bench_sparql` (their gold SPARQL as triple patterns), and
the contamination guard against them (:mod:`.contamination`)."""
