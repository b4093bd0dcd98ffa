"""What every stage is built on: the stage contract (:mod:`.stage`), atomic outputs and their
sidecars (:mod:`.stage_io`, :mod:`.stage_rows`, :mod:`.manifest`, :mod:`.output_lock`), configs
(:mod:`.config`), model folders (:mod:`.modelio`), record schemas (:mod:`.schema`), errors
(:mod:`.errors`), and small shared pieces (:mod:`.text`, :mod:`.plots`, :mod:`.cores`,
:mod:`.tracking`)."""
