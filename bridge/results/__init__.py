"""What a run's result becomes for people and tools: render (the outcome in words, cards, pages), plots
(the judged plots), outcome (a run's outcome and the files written once from it), attest (in-toto
attestations)."""
