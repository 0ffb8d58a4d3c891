"""Hard questions: arena-hard-style training prompts built combinatorially.

The packaged arena-hard-style questions (``arena_hard``) are evaluation material: 72
hand-written questions, most of them in the eval split. A drafter trained without
anything like them meets long, careful answers (explanations, designs, code with
constraints, structured writing) only at evaluation time. This source fills that gap
for TRAINING: every combination of a task, a subject and a constraint in each of six
categories, written for this project (none is taken from arena-hard-auto):

- ``explain``: explain a concept for an audience, in a required shape;
- ``compare``: weigh two alternatives for a situation and recommend one;
- ``coding``: implement a function in a language under an engineering constraint;
- ``design``: design a system at a scale with one focus;
- ``writing``: a professional document about a subject under a style rule;
- ``diagnose``: list the likely causes of a symptom in a setting and how to check each.

Ids are ``hard_questions/<category>/<a>/<b>/<c>``, so ids (and the train/eval split,
the same id hash as every source) never change when a list grows. Use: drafter
training (``split=train``); the ``eval`` split measures held-out loss, and the
benchmark's arena-hard-style workload stays ``arena_hard``.
"""

from __future__ import annotations

from itertools import product

from .base import Prompt, Workload, WorkloadError, pick_by_id, refuse_path, user_turn_prompt

CONCEPTS: dict[str, str] = {
    "tcp_handshake": "the TCP three-way handshake and why it needs three messages",
    "garbage_collection": "generational garbage collection",
    "bayes": "Bayes' theorem and the base-rate fallacy",
    "compound_interest": "compound interest and why early saving matters",
    "public_key": "public-key cryptography and digital signatures",
    "cache_coherence": "CPU cache coherence",
    "inflation": "how central banks use interest rates to fight inflation",
    "photosynthesis": "the light and dark reactions of photosynthesis",
    "vaccines": "how mRNA vaccines train the immune system",
    "consensus": "the Raft consensus algorithm",
    "big_o": "big-O notation and amortised complexity",
    "entropy": "entropy in thermodynamics and in information theory",
    "overfitting": "overfitting and regularisation in machine learning",
    "plate_tectonics": "plate tectonics and why earthquakes cluster",
    "supply_demand": "supply and demand curves and price ceilings",
    "recursion": "recursion and tail calls",
    "dns": "how a DNS lookup resolves a domain name",
    "crispr": "how CRISPR gene editing works",
    "opportunity_cost": "opportunity cost in everyday decisions",
    "attention": "attention in transformer language models",
    "hash_tables": "hash tables, collisions and load factor",
    "climate_feedback": "climate feedback loops such as ice-albedo",
    "git_rebase": "the difference between git merge and git rebase",
    "p_values": "what a p-value does and does not tell you",
    "relativity": "time dilation in special relativity",
    "index_funds": "why index funds often beat active funds after fees",
    "immune_memory": "immunological memory",
    "deadlock": "deadlocks and the four conditions that cause them",
    "marginal_tax": "marginal versus average tax rates",
    "fourier": "the Fourier transform and what a spectrum shows",
}
AUDIENCES: dict[str, str] = {
    "child": "a curious twelve-year-old",
    "new_hire": "a new engineer in their first month",
    "executive": "a busy executive with five minutes",
    "expert": "a specialist from a neighbouring field",
    "skeptic": "a sceptical reader who suspects it is overhyped",
}
SHAPES: dict[str, str] = {
    "analogy": "Open with one concrete analogy, then say where the analogy breaks down.",
    "steps": "Use a numbered sequence of steps, then one worked example.",
    "faq": "Answer as five questions a reader would ask, each with a short answer.",
    "misconceptions": "Cover the three most common misconceptions and correct each.",
    "short": "Stay under 200 words and end with a one-sentence summary.",
}

ALTERNATIVES: dict[str, str] = {
    "sql_nosql": "a relational database or a document store",
    "monolith_micro": "a monolith or microservices",
    "rent_buy": "renting or buying a home",
    "python_rust": "Python or Rust",
    "rest_grpc": "REST or gRPC",
    "cloud_onprem": "a public cloud or on-premises servers",
    "threads_async": "threads or async I/O",
    "kanban_scrum": "Kanban or Scrum",
    "electric_hybrid": "an electric car or a hybrid",
    "react_server": "a single-page app or server-rendered pages",
    "batch_stream": "batch processing or stream processing",
    "sync_replication": "synchronous or asynchronous replication",
    "unit_integration": "more unit tests or more integration tests",
    "lease_loan": "leasing equipment or taking a loan to buy it",
    "orm_raw": "an ORM or hand-written SQL",
    "kubernetes_vm": "Kubernetes or plain virtual machines",
    "mobile_native": "native mobile apps or a cross-platform framework",
    "degree_bootcamp": "a university degree or an intensive bootcamp",
    "solar_grid": "rooftop solar or a green grid tariff",
    "graphql_rest": "GraphQL or REST",
}
SITUATIONS: dict[str, str] = {
    "startup": "a five-person startup that must ship in three months",
    "bank": "a regulated bank with strict audit requirements",
    "nonprofit": "a nonprofit with one part-time engineer",
    "scaleup": "a company whose traffic doubles every six months",
    "student": "a student on a tight budget",
    "legacy": "a team maintaining a fifteen-year-old system",
}
VERDICTS: dict[str, str] = {
    "table": "Give a comparison table first, then your recommendation.",
    "risks": "Name the biggest risk of each option and how to mitigate it.",
    "decision_rule": "End with a simple decision rule the reader could reuse.",
    "numbers": "Support the recommendation with rough numbers.",
}

FUNCTIONS: dict[str, str] = {
    "lru_cache": "an LRU cache with get and put in O(1)",
    "rate_limiter": "a token-bucket rate limiter",
    "json_flatten": "a function that flattens nested dictionaries into dotted keys",
    "roman": "conversion between integers and Roman numerals, both directions",
    "topo_sort": "a topological sort that reports a cycle if there is one",
    "interval_union": "the total length covered by a list of possibly overlapping intervals",
    "csv_stats": "a reader that computes per-column mean and median from CSV text",
    "trie": "a trie with insert, lookup and prefix listing",
    "dijkstra": "Dijkstra's shortest paths on a weighted adjacency list",
    "diff_lines": "a line-based diff that marks added and removed lines",
    "retry": "a retry helper with exponential backoff and jitter",
    "bank_account": "a thread-safe bank account with transfers that cannot deadlock",
    "word_freq": "the k most frequent words of a text, ties broken alphabetically",
    "matrix_spiral": "the spiral order of a matrix",
    "url_parse": "a parser that splits a URL into scheme, host, port, path and query",
    "balanced": "a checker for balanced brackets that reports the first bad position",
    "median_stream": "a running median over a stream of numbers",
    "sudoku_valid": "a validator for a partially filled Sudoku grid",
    "event_bus": "a publish-subscribe event bus with unsubscribe",
    "base64": "base64 encoding and decoding without a library",
}
LANGUAGES: dict[str, str] = {
    "python": "Python", "javascript": "JavaScript", "go": "Go", "rust": "Rust", "java": "Java", "cpp": "C++",
}
CODE_RULES: dict[str, str] = {
    "tests": "Include unit tests that cover the edge cases.",
    "complexity": "State the time and space complexity and justify them.",
    "errors": "Validate the input and raise clear errors on bad input.",
    "no_libs": "Use only the standard library and explain each design choice.",
    "docs": "Document the public interface and give a usage example.",
}

SYSTEMS: dict[str, str] = {
    "chat": "a group chat service", "ride_hailing": "a ride-hailing dispatch system",
    "photo_store": "a photo storage and sharing service", "search": "a search engine for a documentation site",
    "payments": "a payment processing pipeline", "notifications": "a push notification system",
    "leaderboard": "a real-time game leaderboard", "booking": "a hotel booking system",
    "metrics": "a metrics collection and alerting system", "feature_flags": "a feature-flag service",
    "video": "a video upload and transcoding pipeline", "inventory": "an inventory system for a chain of shops",
    "news_feed": "a social news feed", "ticketing": "a concert ticket sale that opens to huge demand",
    "file_sync": "a file synchronisation service like a shared drive", "logging": "a centralised logging platform",
}
SCALES: dict[str, str] = {
    "small": "a thousand users", "city": "a million users in one country",
    "global": "a hundred million users on every continent", "spiky": "traffic that jumps fifty-fold for an hour",
}
FOCUSES: dict[str, str] = {
    "data_model": "Focus on the data model and how it will evolve.",
    "failures": "Focus on what fails first and how the system degrades gracefully.",
    "cost": "Focus on keeping the monthly cost low.",
    "consistency": "Focus on consistency guarantees and where you relax them.",
    "security": "Focus on security and abuse prevention.",
}

DOCUMENTS: dict[str, str] = {
    "postmortem": "an incident postmortem", "proposal": "a one-page project proposal",
    "release_notes": "release notes", "cover_letter": "a cover letter", "policy": "a short team policy",
    "tutorial": "a beginner tutorial", "review": "a balanced review", "memo": "an internal memo",
    "apology": "a customer apology email", "grant": "a grant application summary",
    "onboarding": "an onboarding checklist", "op_ed": "an opinion column",
}
SUBJECTS: dict[str, str] = {
    "outage": "a four-hour outage caused by an expired certificate",
    "four_day_week": "trying a four-day work week",
    "bike_lanes": "new protected bike lanes in a small city",
    "library_app": "a mobile app for a public library",
    "code_review": "a new code review process",
    "heat_pump": "replacing a gas boiler with a heat pump",
    "school_gardens": "gardens in every primary school",
    "open_source": "open-sourcing an internal tool",
    "data_breach": "a data breach that exposed email addresses",
    "remote_team": "a team spread over five time zones",
    "recycling": "a neighbourhood recycling scheme",
    "accessibility": "making a website accessible to screen-reader users",
}
STYLE_RULES: dict[str, str] = {
    "plain": "Use plain language and no jargon.",
    "words_250": "Keep it to about 250 words.",
    "headings": "Use short headings and bullet points.",
    "no_cliches": "Avoid clichés and marketing language.",
    "blameless": "Keep the tone calm and blameless.",
}

SYMPTOMS: dict[str, str] = {
    "slow_page": "a web page that became five times slower after a release",
    "memory_growth": "a service whose memory grows until it is killed",
    "flaky_test": "a test that fails about one run in twenty",
    "wrong_totals": "a report whose totals are off by a few cents",
    "timeouts": "requests that time out only at peak hours",
    "duplicate_orders": "customers who are sometimes charged twice",
    "cpu_spike": "a CPU spike every day at midnight",
    "stale_cache": "users who see stale data after an update",
    "deploy_fail": "deployments that fail only on one server",
    "encoding": "names with accents that show up garbled",
    "clock": "events recorded in the wrong order",
    "disk_full": "a disk that fills up over a weekend",
}
SETTINGS: dict[str, str] = {
    "python_web": "a Python web application", "java_service": "a Java microservice",
    "node_api": "a Node.js API", "mobile": "a mobile app backend", "data_pipeline": "a nightly data pipeline",
    "embedded": "firmware on a small embedded device",
}
DIAGNOSE_ASKS: dict[str, str] = {
    "ranked": "Rank the likely causes and say how to confirm or rule out each.",
    "first_hour": "Describe what you would do in the first hour, step by step.",
    "prevent": "After finding the cause, explain how to prevent it from coming back.",
}

TEMPLATES: dict[str, tuple[str, ...]] = {
    "explain": ("Explain {a} to {b}. {c}", "How would you explain {a} to {b}? {c}"),
    "compare": ("Should {b} choose {a}? {c}", "Compare {a} for {b}. {c}"),
    "coding": ("Implement {a} in {b}. {c}", "Write {b} code for {a}. {c}"),
    "design": ("Design {a} for {b}. {c} Give rough capacity estimates.",
               "How would you build {a} that serves {b}? {c}"),
    "writing": ("Write {a} about {b}. {c}", "Draft {a} on {b}. {c}"),
    "diagnose": ("We see {a} in {b}. {c}", "Help me debug {a} in {b}. {c}"),
}
CATEGORIES: dict[str, tuple[dict[str, str], dict[str, str], dict[str, str]]] = {
    "explain": (CONCEPTS, AUDIENCES, SHAPES),
    "compare": (ALTERNATIVES, SITUATIONS, VERDICTS),
    "coding": (FUNCTIONS, LANGUAGES, CODE_RULES),
    "design": (SYSTEMS, SCALES, FOCUSES),
    "writing": (DOCUMENTS, SUBJECTS, STYLE_RULES),
    "diagnose": (SYMPTOMS, SETTINGS, DIAGNOSE_ASKS),
}


def question_text(category: str, a: str, b: str, c: str) -> str:
    """The question for one combination (keys of the category's three lists)."""
    if category not in CATEGORIES:
        raise WorkloadError(f"hard_questions: unknown category {category!r}; allowed: {sorted(CATEGORIES)}")
    first, second, third = CATEGORIES[category]
    prompt_id = f"hard_questions/{category}/{a}/{b}/{c}"
    return pick_by_id(prompt_id, TEMPLATES[category]).format(a=first[a], b=second[b], c=third[c])


class HardQuestionsWorkload(Workload):
    """Every task x subject x constraint combination of the six categories as a single-turn request."""

    NAME = "hard_questions"

    def load_pool(self) -> list[Prompt]:
        refuse_path("hard_questions", self.spec.path, "'arena_hard' with path= for a question file")
        return [user_turn_prompt(f"hard_questions/{category}/{a}/{b}/{c}", question_text(category, a, b, c),
                                 f"hard_questions:{category}")
                for category, lists in CATEGORIES.items() for a, b, c in product(*lists)]


__all__ = ["CATEGORIES", "HardQuestionsWorkload", "TEMPLATES", "question_text"]
