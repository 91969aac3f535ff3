-- The key row's effects once a request has stored its own ($8, NULL for none): those of an
-- earlier request of the key, taken over after its window but not fanned out yet, are kept, with
-- this request's after them. Every write over a key row's effects does this
-- (`parts/take_over_key.sql`, `parts/update_key.sql`), so no request's effects are ever written
-- over.
    effects = CASE WHEN k.effects IS NULL THEN $8::jsonb
        WHEN $8::jsonb IS NULL THEN k.effects ELSE k.effects || $8::jsonb END
