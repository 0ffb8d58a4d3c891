"""Scenario requests: concrete situations with several explicit asks, built combinatorially for training.

The drafter's held-out accept length on the arena-hard-style workload lags in all six of its
categories. The training-only ``hard_questions`` source asks template one-liners ("explain X
to audience Y in shape Z") and ``worked_problems`` asks for a bug in a snippet, a word problem
or a puzzle. Neither asks the way a user with a real problem does: a CONCRETE SCENARIO with
specifics (versions, error messages, sizes, prices, names, deadlines, constraints), followed by
two to four explicit asks ("explain why, how you would confirm it, and two ways to fix it";
"compare the options and recommend one"; "write the email, including ..."). This source fills
that gap for TRAINING, in six categories written for this project (nothing is taken from
arena-hard-auto or any data set, nor from the packaged ``arena_hard`` questions):

- ``debugging``: an incident in one of many stacks (Django, Node.js, Spring, Go, Rust, C/C++,
  React, SQL, Kubernetes, mobile, data pipelines, CI) with numbers or an error message, some
  with a short fenced excerpt, x what constrains the investigation x an ask-set (cause,
  confirmation and fixes; ranked hypotheses; a postmortem; ...);
- ``reasoning``: a decision or plan under stated constraints with numbers, x one changed
  assumption of that scenario x an ask-set (step by step, a table, a check, sensitivity, ...);
- ``math``: a quantitative scenario (loans, rates, probability, growth and decay, geometry of
  a concrete object, statistics of a small data set, break-even) whose numbers come from a few
  fixed cases, each checked to be well posed when the pool loads, x an ask-set;
- ``writing``: a document with the facts it must contain x a style rule x an extra request;
- ``coding``: a function, class or CLI with signature, examples and edge cases x a language x
  an ask-set (tests, complexity, no dependencies, test-first, ...);
- ``system_design``: a named system x a stated scale (users, requests per second, data, team or
  budget) x two or three specific requirements, with the expected sections of the answer.

Ids are ``scenario_requests/<category>/<a>/<b>/<c>``, built from keys (a math case from its
values), so ids and the train/eval split (the id hash of every source) never change when a list
grows; the wording around the parts varies by id (:func:`workloads.base.pick_by_id`). Use:
drafter training (``split=train``); the ``eval`` split measures held-out loss, and the
benchmark's arena-hard-style workload stays ``arena_hard``.
"""

from __future__ import annotations

import textwrap
from itertools import product

from .base import Prompt, Workload, WorkloadError, pick_by_id, refuse_path, user_turn_prompt
from .worked_problems import MathTemplate, Value, case_key, format_value, math_template, check_math_case

NAME = "scenario_requests"


def _with_code(text: str, fence: str, code: str) -> str:
    """A scenario sentence followed by a fenced excerpt (dedented)."""
    return f"{_one_line(text)}\n\n```{fence}\n{textwrap.dedent(code).strip(chr(10))}\n```"


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- debugging --------------------------------------------------------------------------------

INCIDENTS: dict[str, str] = {
    "django_worker_memory": _one_line("""Our Django 4.2 app runs under Gunicorn with four sync workers in a
        container limited to 2 GB. Each worker's resident memory grows by about 40 MB an hour and the container is
        OOM-killed roughly every nine hours. Traffic is steady at about 30 requests per second, and memory does not
        drop back after a burst of requests ends."""),
    "django_admin_slow": _with_code("""After we added an author column to the admin list page of a Django 4.1 site,
        the page went from 180 ms to 6.5 seconds for 100 rows, and CPU on the PostgreSQL 15 server jumps whenever
        someone opens it. The admin class:""", "python", """
        class ArticleAdmin(admin.ModelAdmin):
            list_display = ("title", "published_at", "author_name")

            def author_name(self, obj):
                return obj.author.profile.display_name
        """),
    "celery_double_charge": _one_line("""A Celery 5.3 task that charges a customer's saved card runs with
        acks_late=True on a Redis broker. About 0.3% of charges are made twice, the second one always 60 to 70
        minutes after the first, and only for tasks that took longer than a minute because the payment provider
        was slow that day."""),
    "node_latency_spikes": _one_line("""A Node.js 20 Express API serving 400 requests per second shows p99 latency
        jumping from 80 ms to 2.4 seconds a few times an hour while p50 stays at 12 ms. Every spike lines up with a
        call to an endpoint that builds a 30 MB JSON export in memory, and the single process sits at 100% CPU for
        the length of the spike."""),
    "node_emfile": _one_line("""A Node.js 18 service that streams user uploads to S3 starts failing after about six
        hours with "Error: EMFILE: too many open files". The count from ls /proc/PID/fd | wc -l grows by roughly
        150 an hour, and a restart clears it until the next time."""),
    "alb_502s": _one_line("""About one request in 800 to a Node.js 20 service behind an AWS Application Load
        Balancer fails with 502 Bad Gateway. The Node logs show nothing for those requests. The service uses the
        default HTTP server settings and the load balancer's idle timeout is 60 seconds."""),
    "hikari_pool": _one_line("""A Spring Boot 3.1 service with HikariCP (maximumPoolSize 10) starts throwing
        "Connection is not available, request timed out after 30000ms" once traffic passes about 150 requests per
        second. PostgreSQL shows exactly ten connections from the service, most of them "idle in transaction"
        for several seconds at a time."""),
    "mysql_deadlocks": _one_line("""Under a load test with 200 concurrent users, a Spring Boot order service logs
        "Deadlock found when trying to get lock; try restarting transaction" from MySQL 8.0 about 40 times a
        minute. Two endpoints are involved: one reserves stock and then updates the order row, the other updates
        the order row and then releases stock."""),
    "jvm_full_gc": _one_line("""A Java 17 service with a 4 GB heap on G1 has full GC pauses of 3 to 5 seconds every
        20 minutes since we started caching resized product images in a ConcurrentHashMap keyed by URL. The heap
        left after each full GC keeps rising: 1.1 GB, then 1.6 GB, then 2.2 GB."""),
    "go_goroutine_leak": _with_code("""A Go 1.21 HTTP service's goroutine count (from /debug/pprof/goroutine) climbs
        from 300 at start to 250,000 after two days, and memory follows. Most stacks end in this function, which
        handlers call with a request context that has a 2-second deadline:""", "go", """
        func fetchAll(ctx context.Context, urls []string) []Result {
            ch := make(chan Result)
            for _, u := range urls {
                go func(u string) { ch <- fetch(ctx, u) }(u)
            }
            var out []Result
            for range urls {
                select {
                case r := <-ch:
                    out = append(out, r)
                case <-ctx.Done():
                    return out
                }
            }
            return out
        }
        """),
    "go_map_writes": _one_line("""A Go service crashes a few times a day with "fatal error: concurrent map writes".
        It keeps per-tenant request counters for rate limiting in a plain map[string]int that HTTP handlers
        update directly. It has never crashed in the test suite, which sends requests one at a time."""),
    "rust_truncated_offsets": _one_line("""A Rust 1.74 command-line tool that sums records in binary log files
        passes all of its tests, but on files larger than 4 GB it reports totals that are far too small, with no
        panic and no error. Offsets inside the file are stored as u32 and converted from u64 with `as` in three
        places."""),
    "cpp_release_segfault": _one_line("""A C++17 image-processing library crashes with a segmentation fault only in
        the -O2 release build made with GCC 12. The debug build and a build with -fsanitize=address at -O1 process
        the same 24-bit image without complaint. The crash is in a loop that reads pixels through a pointer cast
        from uint8_t* to uint32_t*."""),
    "firmware_resets": _one_line("""Firmware in C on an STM32 microcontroller with 64 KB of RAM resets about once a
        day. The reset log shows the watchdog firing about two seconds after a burst of UART messages longer than
        128 bytes; the receive buffer is declared as char rx[128] and filled byte by byte in an interrupt
        handler."""),
    "react_table_freeze": _one_line("""A React 18 dashboard with a table of 2,000 rows freezes for about 1.5 seconds
        whenever the user types in the search box above it. The React Profiler shows every row component
        re-rendering on each keystroke, although only the filter text changed and the rows' data did not."""),
    "react_unread_counter": _with_code("""In a React 18 chat widget, new messages are fetched every five seconds and
        shown correctly, but the unread badge only ever shows the count from the latest poll instead of adding up
        everything unread since the widget opened:""", "jsx", """
        useEffect(() => {
          const id = setInterval(async () => {
            const fresh = await fetchMessages(lastSeenId);
            setUnread(unread + fresh.length);
          }, 5000);
          return () => clearInterval(id);
        }, []);
        """),
    "nextjs_hydration": _one_line("""A Next.js 14 news site logs "Text content does not match server-rendered HTML"
        for roughly 30% of visitors, nearly all of them outside the UK, where the servers are. The warning always
        points at the component that shows an article's publication date and time."""),
    "postgres_seq_scan": _one_line("""A PostgreSQL 15 query that lists a customer's 20 most recent orders went from
        8 ms to 1.9 seconds after the orders table passed 40 million rows. EXPLAIN shows a sequential scan,
        although there is one index on created_at and another on customer_id."""),
    "retry_duplicates": _one_line("""A nightly job inserts the day's exchange rates into a MySQL table. Since we
        added automatic retries on timeouts, some currencies get one to three duplicate rows a day, and a report
        that sums by date double-counts them. The table's only key is an auto-increment id."""),
    "revenue_timezone": _one_line("""Daily revenue totals in our reporting database (PostgreSQL, columns of type
        timestamp without time zone) differ from the payment provider's totals by 2-6% on most days and by much
        more on the last Sundays of March and October. The application servers run in UTC and the finance team
        works in Berlin."""),
    "k8s_probe_restarts": _with_code("""After moving a service to Kubernetes 1.28, its pods restart three or four
        times after every deploy and then settle down. The logs show the application still loading a 2 GB
        reference cache, which takes about 70 seconds, when it is killed. The probe settings:""", "yaml", """
        livenessProbe:
          httpGet:
            path: /healthz
            port: 8080
          initialDelaySeconds: 10
          periodSeconds: 10
          failureThreshold: 3
        """),
    "container_oomkilled": _one_line("""A Java service in a container with a 1 GiB memory limit is OOMKilled (exit
        code 137) several times a day, although it runs with -Xmx1g and the GC logs never show more than 700 MB of
        heap in use. It uses Netty and about 200 threads."""),
    "ci_disk_full": _one_line("""A self-hosted CI runner with 100 GB of disk fills up every four or five days, and
        builds then fail with "no space left on device". Each build runs docker build for three services with
        different tags and pushes the images; nothing on the machine is ever pruned."""),
    "cache_stampede": _one_line("""Product pages are cached in Redis with a 300-second TTL, for our 500 most viewed
        products. Every few minutes database CPU jumps from 30% to 100% for about ten seconds and page latency
        rises to four seconds, and the jumps line up with popular keys expiring."""),
    "ci_flaky_sqlite": _one_line("""A Python suite of 1,800 tests passes every time on laptops, but about one
        GitHub Actions run in six fails, each time on a different test out of a group of roughly 20 that use a
        shared SQLite file. CI runs the suite with pytest-xdist and four workers; laptops run it serially."""),
    "ci_today_test": _one_line("""A Java test that checks the list of "orders placed today" passes on every laptop
        in the New York office, but fails in CI when it runs between 7 p.m. and midnight New York time. The CI
        machines use UTC, and the code calls LocalDate.now() in one place and Instant.now() in another."""),
    "android_fragment_crash": _one_line("""Since the last release, an Android app written in Kotlin (minSdk 26) has
        a crash rate of 1.8%, all "IllegalStateException: Fragment not attached to a context". Almost every crash
        happens when the user rotates the phone or switches apps while a network request of two to three seconds
        is in flight."""),
    "ios_battery_drain": _one_line("""Users say our iOS app has drained about 20% of battery an hour in the
        background since version 3.4, which added live location for delivery tracking. The energy report in Xcode
        shows location updates every second even when the user has no active delivery."""),
    "spark_late_events": _one_line("""A daily Spark job that aggregates click events by date produces totals 3-5%
        lower than a rerun of the same job for the same date a day later. Events land in S3 through Kafka Connect,
        which flushes a file every 10 minutes or 50,000 records, and the job starts at 00:15 UTC."""),
    "etl_mojibake": _one_line("""A Python ETL loads supplier CSV files into PostgreSQL. For about 4% of rows, names
        such as Zoë and Müller arrive as ZoÃ« and MÃ¼ller. The loader opens every file with encoding="cp1252"
        because the first supplier used Windows; a second supplier added last month sends UTF-8."""),
    "kafka_double_writes": _one_line("""After a broker restart, a Java Kafka consumer that copies payment events into
        the warehouse wrote about 12,000 events twice. It uses enable.auto.commit=true with the default 5-second
        interval and writes to the warehouse in batches of 500 from a separate thread."""),
    "nginx_413": _one_line("""Users who upload files larger than about 1 MB to our PHP 8.2 app get "413 Request
        Entity Too Large", although php.ini sets upload_max_filesize = 50M and post_max_size = 55M. The app runs
        behind nginx 1.24 with PHP-FPM."""),
    "tls_chain": _one_line("""At 02:00 UTC every Android client of our API started failing with "SSL handshake
        failed", while browsers kept working. The certificate was renewed automatically two days earlier, and
        openssl s_client run from a laptop shows a valid leaf certificate for the right host name."""),
    "fastapi_blocking": _one_line("""A FastAPI service on Python 3.11 handles 50 requests per second with a p95 of
        40 ms, but p95 rises to three seconds whenever someone calls the report endpoint. That endpoint is an async
        def function that calls requests.get on an internal API that takes about 2.5 seconds to answer."""),
    "websocket_drops": _one_line("""WebSocket connections from browsers drop after exactly 60 seconds without
        messages, and users see a "reconnecting" banner several times an hour. The path is browser, then a CDN,
        then nginx 1.24 with proxy_read_timeout left at its default, then a Node.js server using the ws
        library."""),
    "k8s_dns_delay": _one_line("""Outbound HTTPS calls from pods in our Kubernetes cluster take an extra five
        seconds about 2% of the time, and the extra delay is always almost exactly five seconds. The pods use the
        default resolver settings (ndots:5) and call third-party APIs by host name."""),
    "tokio_mutex_stall": _one_line("""A Rust web service on tokio 1.34 stops answering after a few hours under load,
        with CPU at 0%. A task dump shows many tasks waiting on a std::sync::Mutex that one handler holds across an
        .await while it refreshes an OAuth access token."""),
    "cpp_shared_ptr_cycle": _one_line("""A long-running C++ chat server that keeps sessions in std::shared_ptr grows
        by about 200 MB a day. Valgrind on a short test run reports no definite leaks. Each session stores a
        completion callback that captures a shared_ptr to the session itself."""),
    "ci_cache_miss": _one_line("""CI builds of a JavaScript monorepo take 22 minutes, up from 7, since we moved to
        new runners. Every run logs "Cache not found for input keys", although the post-job step reports that the
        cache was saved; the cache key includes the runner's image version and a hash of package-lock.json."""),
    "billing_month_end": _one_line("""Customers whose monthly plan started on the 31st were not billed at all in
        April, June, September and November, and some were billed twice in March. The renewal date is computed by
        adding one to the month number and keeping the day, falling back to the first of the following month when
        that date does not exist."""),
    "redis_evictions": _one_line("""Our session store on Redis 7 (maxmemory 4 GB, policy allkeys-lru) began logging
        users out at random last week, about 1,500 complaints a day. INFO stats shows evicted_keys rising by 20,000
        an hour at peak, used_memory sits at the limit, and a new feature started caching rendered product pages in
        the same instance with no expiry."""),
    "s3_403_presigned": _one_line("""Pre-signed S3 download links made by our Python 3.12 backend with boto3 work
        for most users, but about 5% of downloads fail with 403 "Request has expired" although the links are set to
        last 15 minutes and users click within seconds. All the failures come from one of our six application
        servers."""),
    "graphql_n_plus_one": _one_line("""A GraphQL API on Apollo Server 4 answers the dashboard query in 4.8 seconds
        for a customer with 300 projects, against 120 ms for a customer with 10. The database log shows one SELECT
        for the projects and then one SELECT per project for its owner and one per project for its latest
        build."""),
    "terraform_drift": _one_line("""Every terraform plan on our AWS production workspace shows the same security
        group rule to be deleted and created again, although nobody changes it, and applying the plan causes a few
        seconds of refused connections to the database each time. The rule is defined both inline in the security
        group resource and as a separate aws_security_group_rule resource."""),
    "mongo_slow_regex": _one_line("""A customer search in our Node.js admin tool, backed by MongoDB 6 with 12 million
        customer documents, takes 9 to 14 seconds and pushes the primary's CPU to 90%. The query is a
        case-insensitive regular expression on the email field, and explain() shows COLLSCAN although an index on
        email exists."""),
    "python_gil_threads": _one_line("""A Python 3.11 image-processing service moved from one worker process to one
        process with 16 threads on a 16-core machine to save memory. Throughput fell from 40 to 11 images a second,
        and top shows the process using about 105% CPU in total while requests queue up."""),
    "dotnet_sync_over_async": _one_line("""An ASP.NET Core 8 API handles 300 requests per second fine, but at about
        450 it stops responding for minutes at a time while CPU stays under 20%. Thread pool counters show the
        thread count climbing by one or two a second, and several controllers call .Result on HttpClient
        tasks."""),
    "cron_dst_double": _one_line("""A nightly billing job scheduled by cron for 01:30 local time on a server in
        London ran twice on the last Sunday of October and not at all on the last Sunday of March. Customers on
        daily plans were charged twice or not at all on those days."""),
    "elasticsearch_yellow": _one_line("""Our three-node Elasticsearch 8 cluster has been yellow for two days and
        search latency doubled. Every index has one replica, one node's disk is at 91% while the others are at
        60%, and the cluster allocation explain API mentions a disk watermark for the unassigned replicas."""),
    "kotlin_coroutine_cancel": _one_line("""In our Android app written in Kotlin, when a user leaves the order
        screen while the order is being submitted, the order is sometimes created twice after they come back and
        tap submit again. The submit call runs in viewModelScope, and a catch block around it catches Exception and
        retries once."""),
    "csv_excel_dates": _one_line("""Finance imports our daily CSV export into Excel, and since last month some
        order dates arrive swapped, 03/04 read as 4 March instead of 3 April, but only for days up to the 12th. The
        export moved from a Windows server to a Linux container at the same time, and the file has no header
        describing the date format."""),
    "load_balancer_sticky": _one_line("""After we scaled our shopping-cart service from three to eight instances
        behind HAProxy, about 8% of users report items vanishing from their cart and reappearing later. Carts are
        kept in each instance's memory, and HAProxy balances with roundrobin and no cookie."""),
    "php_session_locks": _one_line("""Pages of our PHP 8.1 shop that load six AJAX widgets at once take 4 to 6
        seconds for logged-in users but under a second for guests. Each widget endpoint is fast on its own, sessions
        use the default file handler, and the timeline in the browser shows the widget requests finishing one after
        another instead of in parallel."""),
    "rabbitmq_backlog": _one_line("""The order-confirmation queue on RabbitMQ 3.12 grows to 400,000 messages every
        evening and drains only by morning, so emails arrive hours late. Three consumers run with prefetch_count set
        to 1, each message makes one HTTP call to the email provider that takes about 300 ms, and the consumers' CPU
        stays below 5%."""),
    "swift_retain_cycle": _one_line("""Memory in our iOS app grows by about 30 MB every time a user opens and closes
        the chat screen, and after ten visits the app is killed. Instruments shows every chat view controller still
        alive after it is dismissed; the controller subscribes to a message publisher with a closure that calls
        self.reload()."""),
    "postgres_lock_migration": _one_line("""A database migration that added a column with a default value to the
        orders table, 80 million rows on PostgreSQL 10, took the whole site down for 25 minutes at 11:00 on a
        weekday. During that time every query on the table waited, and pg_stat_activity showed them blocked behind
        the ALTER TABLE."""),
    "java_timezone_tests": _one_line("""Our Java 21 build passes on every developer laptop in Berlin but fails in CI
        on GitHub-hosted runners with three assertion errors in the invoice tests, each one hour off. The tests
        build dates with LocalDateTime.now() and compare them with values parsed from fixed strings such as
        "2024-03-31T02:30"."""),
    "cdn_stale_assets": _one_line("""After each deploy, about one user in twenty sees a broken page for up to an
        hour: the new HTML loads but the browser console shows errors from the old JavaScript bundle. Our bundles
        are served through a CDN as app.js and app.css without a content hash in the name, with a cache lifetime
        of one hour."""),
    "airflow_backfill": _one_line("""After we changed the start_date of an Airflow 2.7 DAG to fix a typo, the
        scheduler launched 340 runs at once, one for every day since the new date, and overloaded the warehouse for
        most of a morning. Catchup was left at its default, and the DAG runs a heavy aggregation query for each
        day."""),
    "unicode_username_dupes": _one_line("""Two customers of our Ruby on Rails 7 app ended up sharing one account:
        both signed up as "José", one typed on a Mac and one on Windows, and the login looks users up by the
        exact name. Support has found 45 such pairs, and the uniqueness validation on the name column never
        fired."""),
}
DEBUG_CONTEXTS: dict[str, str] = {
    "new_to_code": "I am new to this codebase, so please spell out each step.",
    "release_freeze": "A release freeze starts in two days, so prefer fixes that are small and safe.",
    "no_debugger": "We can add logging and metrics freely but cannot attach a debugger where it happens.",
    "team_split": "The team has argued about this for a week; be direct about which explanation is most likely.",
    "on_call_alone": "I am on call alone tonight and can change configuration but cannot deploy new code before "
                     "the morning.",
    "prod_only": "It only happens in production; staging runs the same code with a tenth of the traffic and older "
                 "data.",
    "vendor_blame": "Our vendor says the problem is on our side, so I need evidence I can show them either way.",
    "upgraded_lately": "We upgraded several dependencies last month, so keep that in mind without assuming it is the "
                       "cause.",
}
DEBUG_ASKS: dict[str, str] = {
    "cause_confirm_fix": "Explain the most likely cause, how you would confirm it (which tools, commands or metrics "
                         "you would look at), and two ways to fix it, with the trade-off between them.",
    "three_hypotheses": "Rank three hypotheses from most to least likely. For each, describe one experiment that "
                        "would confirm or rule it out and the result you would expect if it were true.",
    "postmortem": "Write a short blameless postmortem: a summary, a timeline with plausible times, the root cause "
                  "as you judge it most likely, and three follow-up actions with an owner role for each.",
    "first_thirty": "Walk me through what you would check in the first thirty minutes, in order and with the "
                    "exact commands or queries, and then say which fix you expect to end up with.",
    "fix_and_guard": "Say what most likely went wrong, propose a fix, and describe a test or an alert that would "
                     "have caught this before users noticed.",
    "junior_colleague": "Explain what is probably happening in plain terms for a junior colleague, then give the fix "
                        "you would ship today and the one you would plan for next quarter.",
    "roll_back_or_not": "Tell me whether you would roll back, ship a hot fix or wait, and why. Then list the evidence "
                        "that would change your mind and how to collect it.",
}
DEBUG_TEMPLATES: tuple[str, ...] = ("{a}\n\n{b} {c}", "{a}\n\n{c} {b}", "{b}\n\n{a}\n\n{c}")


# --- reasoning --------------------------------------------------------------------------------

SCENARIOS: dict[str, tuple[str, dict[str, str]]] = {
    "crm_vendor": ("""Our 40-person company must pick a CRM. Vendor A charges $25 per user per month with a
        12-month commitment and a $2,000 setup fee. Vendor B charges $32 per user per month, billed monthly, with
        no setup fee, and includes the phone integration that costs $300 a month extra with A. We expect to grow
        to 55 users after six months.""",
                   {"grow_70": "we grow to 70 users after six months instead of 55",
                    "no_setup": "vendor A waives its setup fee",
                    "no_phone": "we decide we do not need the phone integration at all"}),
    "oncall_rota": ("""Six engineers, Ana, Ben, Chen, Dara, Eli and Fay, must cover one week of on-call, one person a
        day from Monday to Sunday. Ben and Dara cannot take weekend days, Chen is away on Wednesday and Thursday,
        nobody may be on call two days in a row, and a weekend day counts as two units of load against one for a
        weekday. We want the load spread as evenly as possible.""",
                    {"fay_leaves": "Fay leaves the team before the week starts",
                     "two_saturday": "Saturday needs two people on call instead of one",
                     "eli_monday": "Eli can only do Monday"}),
    "relaunch_tasks": ("""A website relaunch has these tasks: content audit (3 days); design (5 days, after the
        audit); copywriting (4 days, after the audit); front-end build (6 days, after design); CMS setup (2 days,
        no prerequisite); loading content (3 days, after copywriting and CMS setup); testing (2 days, after the
        build and the content loading). Two people can work in parallel, each on one task at a time. What is the
        earliest the relaunch can finish, and in what order should they work?""",
                       {"third_person": "a third person joins for the whole project",
                        "design_8": "design takes 8 days instead of 5",
                        "cms_after_design": "CMS setup cannot start until design is finished"}),
    "bakery_marketing": ("""A small bakery has $6,000 for marketing this quarter. The options: a local radio slot
        ($2,500, expected to bring 150 new customers); a loyalty app ($1,800 setup plus $150 a month, expected to
        raise visits by 10% among 900 regulars who come twice a month); social media ads (any amount, about one new
        customer per $12); and stalls at two food fairs ($900 each, about 60 new customers each). A new customer
        is worth about $40 of profit over a year and a regular's extra visit about $4.""",
                         {"budget_4000": "the budget is cut to $4,000",
                          "ads_20": "the cost of a new customer from ads rises to $20",
                          "radio_half": "the radio slot brings only half the expected customers"}),
    "chess_league": ("""Ten teams play a round-robin league, each pair meeting once over nine rounds, with 3 points
        for a win, 1 for a draw and 0 for a loss. After seven rounds team A has 17 points, team B 15 and team C 14;
        no other team has more than 11. In round 8 A plays B and C plays D; in round 9 A plays C and B plays E.
        Teams level on points share first place. Which teams can still win or share the title, and what results
        would each need?""",
                     {"c_12": "team C has 12 points after seven rounds instead of 14",
                      "a_18": "team A has 18 points after seven rounds instead of 17",
                      "head_to_head": "ties on points are broken by the head-to-head result between the teams"}),
    "support_staffing": ("""A support team answers 1,200 tickets a week. Each agent handles 45 tickets a day over a
        five-day week, and the goal is to answer every ticket within one working day. Ticket volume grows 8% a
        month, hiring takes six weeks, and a new agent works at half speed during their first month. How many
        agents are needed now, and when should the next hires start?""",
                         {"growth_15": "ticket volume grows 15% a month instead of 8%",
                          "tooling_55": "a new tool lets each agent handle 55 tickets a day",
                          "four_hours": "the goal becomes an answer within four working hours"}),
    "warehouse_site": ("""A company ships to three cities: X (4,000 orders a month), Y (2,500) and Z (1,500). X to Y
        is 120 km, Y to Z is 80 km and X to Z is 150 km. It can put its single warehouse in any of the three
        cities. Delivery costs $0.05 per order per km, and rent is $9,000 a month in X, $6,000 in Y and $4,500 in
        Z.""",
                       {"z_doubles": "orders from Z double",
                        "x_rent_6000": "rent in X falls to $6,000 a month",
                        "cost_008": "delivery costs rise to $0.08 per order per km"}),
    "flags_build_buy": ("""A 12-person engineering team needs a feature-flag system. Buying one costs $1,100 a month.
        Building it is estimated at six engineer-weeks, with an engineer costing about $3,000 a week fully loaded,
        plus about two days of maintenance a month. The system will be used for at least three years.""",
                        {"slip_50": "the build estimate slips by 50%",
                         "price_rise": "the vendor raises its price by 20% after the first year",
                         "audit_tier": "we need an audit trail, which the vendor only offers at $1,800 a month"}),
    "global_meeting": ("""Five colleagues in San Francisco (UTC-8), New York (UTC-5), London (UTC+0), Bangalore
        (UTC+5:30) and Sydney (UTC+11) need a weekly 45-minute meeting. Each accepts a start time between 07:00 and
        21:00 in their own time zone, and the Sydney colleague cannot meet on Fridays. Is there a slot that suits
        everyone, and if not, what is the fairest arrangement?""",
                       {"sydney_wider": "the Sydney colleague accepts any start between 06:00 and 23:00",
                        "sf_drops": "the San Francisco colleague no longer needs to attend",
                        "two_sessions": "the meeting may be split into two sessions with a written handover"}),
    "conference_rooms": ("""Seven talks must be placed in four time slots and two rooms holding 150 and 60 people.
        Expected audiences: T1 140, T2 90, T3 50, T4 55, T5 120, T6 30, T7 45. T1 and T5 have the same speaker, T2
        and T4 appeal to the same people and should not run at the same time, and T7 must be in the last slot.
        Nobody should be turned away for lack of seats.""",
                         {"t3_80": "T3's expected audience grows to 80",
                          "three_slots": "only three time slots are available",
                          "t6_first": "T6 must be in the first slot"}),
    "quarter_projects": ("""A team has 20 developer-weeks next quarter. Candidates: a search revamp (8 weeks, worth
        about $40,000 a year), a billing migration (10 weeks, avoids a $60,000 fee due in nine months), dark mode
        for the mobile app (3 weeks, mostly goodwill), API rate limiting (4 weeks, prevents outages that cost about
        $15,000 each, of which there were two last year) and a new onboarding flow (6 weeks, worth about $25,000 a
        year).""",
                         {"fee_18_months": "the billing fee falls due in eighteen months instead of nine",
                          "capacity_15": "capacity drops to 15 developer-weeks",
                          "search_halves": "the search revamp can be split into two 4-week halves, each worth half"}),
    "clinic_reception": ("""A clinic is open 08:00 to 20:00, Monday to Saturday, and needs two receptionists at the
        desk at all times. Shifts last 6 or 8 hours and start on the hour; a receptionist works at most 40 hours
        and at most five days a week. What is the smallest number of receptionists that can cover the week, and
        what shift pattern does it?""",
                         {"saturday_half": "the clinic closes at 14:00 on Saturdays",
                          "four_hour_shifts": "4-hour shifts are also allowed",
                          "one_after_17": "one receptionist is enough after 17:00"}),
    "cloud_commitments": ("""We run 24 virtual machines around the clock and 16 more only during weekday business
        hours, 10 hours a day. On-demand costs $0.20 an hour per machine. A one-year reservation costs $1,000 per
        machine, paid upfront, and covers that machine for every hour of the year. A savings plan gives 30% off
        on-demand prices in return for committing to at least $3 an hour of spend.""",
                          {"14_hours": "the business-hours machines run 14 hours a day instead of 10",
                           "move_half": "half of the always-on machines may move to another provider in six months",
                           "reservation_900": "the reservation price drops to $900"}),
    "saas_pricing": ("""A software product has 2,000 customers on a single $20-a-month plan. A survey suggests that
        25% would move to a new $35 plan with priority support, that 10% would cancel if the base plan rose to $24,
        and that a $10 starter plan would attract about 300 new customers but pull 15% of current customers down
        to it. Serving a customer costs about $4 a month whatever the plan.""",
                     {"churn_20": "20% rather than 10% would cancel at $24",
                      "support_cost": "priority support costs $8 a month per customer who takes it",
                      "starter_600": "the starter plan would attract 600 new customers"}),
    "commute_options": ("""A worker can commute by car (35 minutes each way, $9 a day for fuel and parking), by train
        (50 minutes each way door to door, a $120 monthly pass) or by bike (55 minutes each way, about $25 a month
        in upkeep, impossible on the roughly six rainy days a month, when they take the train on a day ticket at
        $11). They work 20 days a month and value their time at $20 an hour, but they can read on the train and
        count train time at half that value.""",
                        {"remote_2": "they start working from home two days a week",
                         "parking_15": "parking rises so the car costs $15 a day",
                         "time_value_40": "they value their time at $40 an hour"}),
    "release_decision": ("""A mobile release is due on Friday. QA found three bugs: one crashes the app for the 2%
        of users still on Android 9, one shows the wrong currency symbol to Swiss users (1% of revenue), and one
        slows the login screen by 400 ms for everyone. Delaying the release a week costs $15,000 in fees for a
        marketing campaign that is already booked. A hotfix takes two days to build plus up to three days of
        app-store review.""",
                         {"android_9_8": "8% of users are on Android 9",
                          "fast_review": "app-store review reliably takes less than a day",
                          "campaign_movable": "the campaign can move by a week for $3,000"}),
    "exam_hours": ("""A student has 30 hours of study time over the next six days, at most 8 hours a day, for three
        exams: statistics on day 3 (40% of the term grade, currently expecting 55 out of 100), history on day 5
        (30%, expecting 70) and French on day 6 (30%, expecting 80). Each hour on statistics adds about 2 marks up
        to 20 hours, each hour on history about 1.5 marks up to 10 hours, and each hour on French about 1 mark. Hours
        for an exam only count if studied before its day.""",
                   {"stats_pass_60": "statistics must reach 60 to pass the course, whatever the weighted grade",
                    "sick_day_2": "the student is ill on day 2 and cannot study",
                    "french_2": "French returns 2 marks an hour for the first 5 hours"}),
    "datacentre_exit": ("""Twelve services must leave a data centre whose lease ends in ten weeks: four stateless
        services (one engineer-week each), five services with databases (two engineer-weeks each, plus a one-hour
        downtime window that is only allowed on a Sunday, at most two windows per Sunday), and three legacy
        services that share a file server and must move together (four weeks with two engineers). Three engineers
        are available for the whole period.""",
                        {"one_window": "only one downtime window is allowed per Sunday",
                         "engineer_leaves": "one engineer leaves after week five",
                         "lease_8": "the lease ends in eight weeks instead of ten"}),
    "dual_supplier": ("""A factory buys a part from one supplier at $4.00 a unit, and 2% of its shipments arrive
        late. A late shipment stops the line for a day, which costs $30,000. A second supplier offers $4.30 a unit
        with 0.5% of shipments late. The factory uses 50,000 parts a month in 20 shipments, and it may split its
        orders between the two in any proportion.""",
                      {"stop_cost_10k": "a stopped day costs only $10,000",
                       "late_4": "the first supplier's late rate rises to 4%",
                       "buffer_stock": "holding one day of safety stock (2,500 parts) costs $1,500 a month"}),
    "coffee_rush": ("""A coffee stand gets about 90 customers an hour in the morning rush from 07:30 to 09:00 and
        about 25 an hour from 09:00 to 15:00. One barista alone serves a customer every 1.5 minutes; two together
        serve one every 55 seconds. A barista costs $22 an hour, and the owner wants nobody to wait more than five
        minutes in the rush.""",
                    {"rush_120": "the rush grows to 120 customers an hour",
                     "third_barista": "a third barista raises the pace to one customer every 40 seconds",
                     "wage_28": "wages rise to $28 an hour"}),
    "household_plan": ("""A couple take home $6,200 a month. Fixed costs are $3,100, including rent. They owe
        $14,000 on credit cards at 22% a year and $9,000 in student loans at 4.5%, have $2,000 in savings, and want
        a $6,000 emergency fund and a $25,000 house deposit. Minimum payments are $420 a month on the cards and $150
        on the loans. How should they use the $3,100 left each month, and in what order?""",
                       {"rate_12": "the cards can be moved to a 12% consolidation loan for a $300 fee",
                        "bonus_5000": "one of them receives a $5,000 bonus in month three",
                        "rent_up": "their rent rises by $400 a month in six months"}),
    "canary_rollout": ("""A feature is ready to roll out to a million users. A 2% canary showed crashes rising from
        1.1% to 1.5% of users a week and checkout conversion rising by 3% in relative terms. Each crash costs about
        $0.50 in support and lost users, an extra checkout is worth $6, and 4% of users check out in a typical
        week.""",
                       {"crash_cost_3": "each crash costs $3 instead of $0.50",
                        "noisy_canary": "the canary's conversion lift has a 95% interval of -1% to +7%",
                        "fix_week": "a fix for the crash could ship in one week"}),
    "lab_queue": ("""A lab has two machines. Machine M1 runs a sample in 20 minutes and M2 in 30 minutes, and each
        runs one sample at a time. Eleven samples arrive at 08:00; three of them are urgent and must be finished by
        09:00, and the rest are due by 12:00. A technician needs 5 minutes to load each sample, and there is only
        one technician. What schedule meets the deadlines, and when does the last sample finish?""",
                  {"second_tech": "a second technician is available",
                   "m2_down": "M2 is down until 10:00",
                   "five_urgent": "five of the samples are urgent"}),
    "hotel_overbooking": ("""A 120-room hotel sells rooms at $150 a night. On average 8% of bookings do not show up,
        independently of one another. If more guests arrive than there are rooms, the hotel pays $400 per guest it
        must send to another hotel. The manager wants to know how many bookings to accept for a typical
        night.""",
                          {"no_show_4": "the no-show rate falls to 4% after a deposit rule",
                           "walk_cost_900": "sending a guest away costs $900 because of a nearby festival",
                           "rooms_100": "20 rooms are closed for renovation"}),
    "delivery_routes": ("""A florist makes deliveries with two vans on Valentine's Day. 60 orders must be delivered
        between 09:00 and 17:00. A van takes 12 minutes per drop on average including driving, must return to the
        shop to reload after every 15 orders (20 minutes per round trip and reload), and the drivers need a
        30-minute break each. A third van can be hired for the day for $280, and each order not delivered in time
        is refunded at $55.""",
                        {"orders_80": "orders rise to 80",
                         "drop_9": "better routing brings the time per drop down to 9 minutes",
                         "van_cap_20": "a van can carry 20 orders before reloading"}),
    "office_space": ("""A 45-person company must choose office space for a three-year term. Option 1: a traditional
        lease at $38 per square foot a year for 6,000 square feet, plus $90,000 of fit-out in the first year.
        Option 2: a flexible workspace at $650 per desk a month, with 30 desks, since on a typical day about 60%
        of staff come in. Option 3: fully remote, with a $100 monthly allowance per person and $40,000 a year for
        meet-ups.""",
                     {"headcount_70": "the company grows to 70 people within a year",
                      "attendance_85": "typical attendance rises to 85%",
                      "break_clause": "the lease gets a break clause after 18 months for a $30,000 fee"}),
    "van_or_courier": ("""Our bakery delivers about 60 orders a day to cafés within 15 km. A courier firm charges $6.50
        per delivery. Leasing a van would cost $1,100 a month plus about $14 a day in fuel, and a driver would cost
        $2,900 a month for five days a week; the van could also collect flour, saving a $250 monthly supplier
        delivery charge. We deliver six days a week.""",
                       {"orders_90": "orders grow to 90 a day",
                        "courier_cut": "the courier offers $5.20 per delivery for a one-year contract",
                        "fuel_double": "fuel costs double"}),
    "hire_or_contract": ("""A product team must ship a mobile app in nine months. Hiring two permanent developers
        costs $9,500 a month each including overheads, after a two-month recruiting gap and $12,000 in recruiting
        fees. A contracting agency offers two developers at $16,000 a month each, available in two weeks, with a
        three-month minimum. After launch, one developer's worth of maintenance is needed indefinitely.""",
                         {"six_months": "the deadline moves forward to six months",
                          "agency_discount": "the agency drops its rate to $13,500 a month each",
                          "recruit_four": "recruiting takes four months instead of two"}),
    "solar_panels": ("""A household pays $0.28 per kWh and uses 4,200 kWh a year. A 4 kW solar system costs $7,800
        installed, should produce 3,900 kWh a year, and about 45% of that would be used at home; the rest is sold to
        the grid at $0.06 per kWh. The panels lose about 0.5% of their output each year and are guaranteed for 25
        years.""",
                     {"battery": "a $4,500 battery raises the share used at home to 80%",
                      "price_rise": "the electricity price rises by 5% a year",
                      "export_zero": "the grid stops paying for exported power"}),
    "warehouse_shift": ("""A warehouse ships 9,000 parcels a day on one 10-hour shift with 45 pickers, each picking
        about 20 parcels an hour. Sales expect 13,000 parcels a day before the holidays. Overtime pays 1.5 times the
        normal $22 an hour, a second shift needs a $3,000 a week supervisor, and temporary workers are 30% slower
        in their first two weeks.""",
                        {"peak_15000": "the peak turns out to be 15,000 parcels a day",
                         "temps_fast": "temporary workers reach full speed after one week",
                         "overtime_cap": "staff may not work more than five hours of overtime a week"}),
    "course_selection": ("""A student has 40 hours of study a week and must choose three of five courses. Statistics
        needs 14 hours a week, Databases 12, Economics 10, Design 9 and Ethics 7. Her scholarship requires an
        average grade of at least 70; from past results she expects 62, 78, 71, 85 and 74 respectively if she gives
        each course its full hours. Databases is required for the internship she wants.""",
                         {"job_10": "she takes a part-time job of 10 hours a week",
                          "stats_required": "Statistics also becomes compulsory",
                          "threshold_75": "the scholarship threshold rises to 75"}),
    "server_upgrade": ("""Our on-premise database server is five years old, costs $4,200 a year in support, and
        fails about twice a year with four hours of downtime each time, which costs roughly $6,000 an hour in lost
        orders. A new server costs $28,000 with three years of support included. A managed cloud database of the
        same size costs $2,100 a month with 99.95% availability.""",
                       {"downtime_3000": "an hour of downtime costs $3,000 instead of $6,000",
                        "cloud_reserved": "the cloud provider offers 35% off for a three-year commitment",
                        "four_failures": "the old server starts failing four times a year"}),
    "library_hours": ("""A town library is open 50 hours a week with a budget that must fall by 12%. Staff cost $38
        an hour, and two staff are needed whenever it is open. Visitor counts per hour are about 60 on weekday
        evenings, 25 on weekday mornings and 80 on Saturdays; the library is open 20 morning hours, 20 evening hours
        and 10 Saturday hours a week.""",
                      {"cut_20": "the cut is 20% instead of 12%",
                       "volunteers": "trained volunteers can replace one of the two staff on Saturdays",
                       "sunday": "the council asks for four Sunday hours as well"}),
    "freight_mode": ("""A furniture importer moves 24 containers a year from Shanghai to Rotterdam. Sea freight costs
        $2,400 per container and takes 38 days; rail costs $6,100 and takes 18 days. Holding stock costs about 1.5%
        of its $80,000 value per container each month, and a late container during the spring sale loses about
        $9,000 in sales.""",
                     {"sea_delays": "sea shipments run two weeks late a third of the time",
                      "rail_discount": "rail offers $5,000 per container for 12 or more a year",
                      "value_120k": "each container's stock is worth $120,000"}),
    "print_shop_machine": ("""A print shop turns away about 30 large-format jobs a month, each worth $120 in revenue
        at a 55% margin. A large-format printer costs $18,000, or $650 a month to lease for three years, plus $200 a
        month in maintenance. Running it needs about 40 hours of staff time a month at $24 an hour.""",
                           {"jobs_45": "demand turns out to be 45 jobs a month",
                            "margin_40": "the margin falls to 40% because of ink prices",
                            "resale": "the bought printer can be resold for $6,000 after three years"}),
    "team_meeting_time": ("""A team of eight spread over San Francisco (three people), New York (two), London (two)
        and Bangalore (one) needs one weekly hour-long meeting. Everyone works 09:00 to 17:00 local time, nobody
        should meet before 08:00 or after 20:00 local time, and the pain of an early or late slot should be shared
        over a month.""",
                          {"bangalore_two": "a second engineer joins in Bangalore",
                           "no_sf_early": "the San Francisco staff refuse anything before 09:00",
                           "two_meetings": "the team may split into two half-hour meetings"}),
    "car_choice": ("""A family drives 14,000 km a year and must replace its car. A petrol car costs $24,000 and uses
        7 litres per 100 km at $1.90 a litre, with $900 a year of servicing. An electric car costs $33,000, uses 17 kWh
        per 100 km at $0.22 per kWh charged at home, with $400 a year of servicing. They keep cars for eight
        years.""",
                   {"km_22000": "they drive 22,000 km a year",
                    "grant": "a $4,000 government grant applies to the electric car",
                    "public_charging": "half the charging has to be done at public chargers at $0.55 per kWh"}),
    "support_tooling": ("""A support team of 12 answers 6,000 tickets a month with an average handling time of 9
        minutes. A chatbot subscription costs $2,400 a month and the vendor claims it resolves 30% of tickets without
        an agent; agents cost $34 an hour fully loaded. Tickets the chatbot fails on take agents 2 minutes longer
        because customers arrive annoyed.""",
                        {"resolve_15": "the chatbot actually resolves only 15% of tickets",
                         "tickets_9000": "ticket volume grows to 9,000 a month",
                         "price_3600": "the vendor raises the price to $3,600 a month"}),
}
REASONING_ASKS: dict[str, str] = {
    "steps": "Reason step by step and show the numbers at each step, then state your answer in one sentence. "
             "Finally, say how the answer changes if {change}.",
    "table": "Lay out the options in a small table with the figures that matter, recommend one with your "
             "reasons, and then redo the decision assuming {change}.",
    "assumptions": "First list any assumptions you have to make, then work out the answer, then check it against "
                   "every constraint in the question. Last, explain what happens if {change}.",
    "flip_point": "Give your recommendation and the reasoning behind it, then find the value of one input at "
                  "which the recommendation would flip, and say whether it flips if {change}.",
    "manager": "Explain your answer as you would to a manager who will ask why not the alternative: the "
               "reasoning, the answer, and a short note on what to do if {change}.",
    "two_methods": "Work it out carefully, then confirm the result with an independent estimate or a second way "
                   "of counting. After that, tell me what changes if {change}.",
    "biggest_risk": "Work out the best plan, name the single biggest risk in it, and say how the plan should be "
                    "adjusted if {change}.",
    "pros_cons": "List the pros and cons of each option with the numbers behind them, choose one, and then say "
                 "whether your choice survives if {change}.",
    "break_even": "Work out where the options break even, explain what that means for us in plain words, and "
                  "recompute it assuming {change}.",
    "decision_memo": "Write a short decision memo: the question, the options with their costs, your recommendation, "
                     "and a final paragraph on what we should do if {change}.",
    "other_side": "Make the best case for the option you would not choose, then give your own recommendation with "
                  "the numbers, and finally say how things change if {change}.",
    "checklist": "Give a numbered checklist of what to decide and in which order, with the figures for each step, "
                 "and mark which steps change if {change}.",
}


# --- math -------------------------------------------------------------------------------------

MATH: dict[str, MathTemplate] = {
    "car_loan_offers": math_template("price down years r1 r2 fee", """Priya is buying a used car for ${price} and can
        put
        down ${down}. The dealer offers a {years}-year loan at {r1}% a year, compounded monthly, with equal monthly
        payments. Her credit union offers the same term at {r2}%, but adds a ${fee} arrangement fee to the amount
        borrowed. Which loan costs her less in total, and by how much?""",
                             [(18500, 3500, 5, 7.9, 6.4, 600), (24000, 6000, 4, 8.5, 6.9, 450),
                              (12900, 2000, 3, 9.9, 7.5, 300), (31000, 5000, 6, 6.9, 6.1, 900)],
                             lambda price, down, years, r1, r2, fee: down < price and r2 < r1),
    "mortgage_overpayment": math_template("principal rate years extra", """A couple have a ${principal} mortgage at
        {rate}%
        a year over {years} years, repaid monthly with interest charged monthly. They could add ${extra} to every
        monthly payment. What is the normal monthly payment, how much sooner would the mortgage be paid off with
        the extra amount, and how much interest would that save?""",
                                  [(250000, 5.5, 25, 200), (180000, 4.2, 30, 150), (320000, 6.1, 25, 500),
                                   (140000, 3.8, 20, 100)]),
    "deposit_savings": math_template("goal years start rate", """Sam wants ${goal} for a flat deposit in {years}
        years. He has
        ${start} saved now in an account paying {rate}% a year, compounded monthly. How much must he add at the
        end of each month to reach the goal exactly on time?""",
                             [(40000, 5, 8000, 4.5), (25000, 3, 2500, 3.6), (60000, 7, 12000, 5.0),
                              (15000, 2, 4000, 4.0)],
                             lambda goal, years, start, rate: start * (1 + rate / 1200) ** (12 * years) < goal),
    "room_paint": math_template("length width height windows cover tin", """A bedroom is {length} m by {width} m with a
        ceiling {height} m high. It has one door of 0.9 m by 2.0 m and {windows} windows of 1.2 m by 1.0 m. The walls
        (not the ceiling) need two coats, one litre of paint covers {cover} square metres per coat, and paint is sold
        in 2.5-litre tins at ${tin} each. How many tins are needed and what do they cost?""",
                    [(4.2, 3.6, 2.4, 2, 12, 24), (5.0, 4.0, 2.7, 1, 10, 31), (3.5, 3.0, 2.5, 2, 11, 19),
                     (6.0, 4.5, 2.6, 3, 13, 28)]),
    "coffee_unit_price": math_template("a_g a_price b_g b_price weekly", """Shop A sells a {a_g} g bag of coffee for
        ${a_price}. Shop B sells a {b_g} g bag for ${b_price}, with a deal of three bags for the price of two and a
        half. A household drinks {weekly} g a week. What is the price per kilogram in each case, and what does each
        option cost the household over a year?""",
                           [(250, 6.5, 1000, 21, 180), (340, 8.99, 907, 19.49, 250),
                            (500, 11, 1000, 20.5, 120), (200, 5.25, 750, 16.8, 300)]),
    "road_trip_fuel": math_template("km per100 price tank", """A family plans a {km} km road trip in a car that uses
        {per100} litres of fuel per 100 km. Fuel costs ${price} a litre, the tank holds {tank} litres, they start
        with a full tank, and they refuel (to full) whenever a quarter of a tank is left. What will the fuel cost for
        the trip, and how many fuel stops do they need?""",
                        [(1450, 6.8, 1.85, 55), (980, 8.2, 1.72, 60), (2300, 5.4, 1.95, 45),
                         (620, 7.5, 1.66, 50)]),
    "batch_inspection": math_template("p n k", """A machine makes bolts of which {p}% are defective, independently of
        each
        other. An inspector takes {n} bolts at random from each batch and rejects the batch if {k} or more of them
        are defective. What is the probability that a batch is rejected? What is the probability if the defect rate
        doubles?""",
                          [(2, 20, 2), (1, 50, 2), (5, 10, 2), (3, 30, 3)],
                          lambda p, n, k: 0 < k <= n and 2 * p < 100),
    "raffle_prizes": math_template("tickets mine", """A school raffle sells {tickets} tickets, and {mine} of them are
        mine. Three different prizes are drawn one after another, and a winning ticket is not put back. What is
        the probability that I win at least one prize, and the probability that I win all three?""",
                           [(200, 10), (500, 25), (150, 4), (80, 8)],
                           lambda tickets, mine: 3 <= mine < tickets),
    "dice_stall": math_template("stake win target", """At a fair, a stall charges ${stake} to roll two fair six-sided
        dice.
        If the total is {target} or more you get ${win} back (your stake included); otherwise you get nothing. What
        is the expected profit or loss per game for the player, and what prize would make the game fair?""",
                        [(2, 7, 10), (1, 3, 9), (5, 12, 11), (3, 5, 8)],
                        lambda stake, win, target: 2 <= target <= 12),
    "screening_test": math_template("prev sens spec", """A screening test for a condition that affects {prev}% of the
        people tested has a sensitivity of {sens}% and a specificity of {spec}%. A person tests positive. What is
        the probability that they have the condition? What is it after a second, independent positive test?""",
                            [(1, 95, 90), (0.5, 99, 97), (4, 88, 92), (10, 80, 95)]),
    "user_growth": math_template("users growth capacity", """A start-up has {users} active users, growing {growth}% a
        month.
        Its current servers can handle {capacity} users. In which month will demand first exceed capacity, what is
        the doubling time of the user base, and how many users will there be after two years at this rate?""",
                         [(12000, 9, 50000), (3500, 15, 40000), (80000, 4, 150000), (500, 25, 20000)],
                         lambda users, growth, capacity: users < capacity),
    "drug_dosing": math_template("dose half interval", """A patient takes {dose} mg of a drug every {interval} hours.
        The
        drug has a half-life of {half} hours and is absorbed immediately. How much is in the body just before the
        fourth dose, and what level does the amount right after a dose approach in the long run?""",
                         [(200, 6, 8), (500, 12, 12), (100, 4, 6), (50, 24, 24)]),
    "equipment_value": math_template("price rate years floor", """A bakery buys an oven for ${price}. For its
        accounts it
        can depreciate the oven by {rate}% of the remaining value each year, or by an equal amount each year over
        {years} years to zero. It plans to replace the oven once the first method shows a value under ${floor}.
        When will that be, and how do the two methods compare year by year until then?""",
                             [(42000, 20, 8, 10000), (18000, 25, 6, 4000), (9500, 30, 5, 2000),
                              (65000, 15, 10, 20000)],
                             lambda price, rate, years, floor: floor < price),
    "water_tank": math_template("diameter height rate pct", """A cylindrical rainwater tank is {diameter} m across and
        {height} m tall. It is {pct}% full, and a pump adds water at {rate} litres per minute. How long will it take
        to fill, and how high is the water 30 minutes after the pump starts?""",
                        [(1.8, 2.2, 40, 25), (2.5, 3.0, 90, 10), (1.2, 1.5, 15, 40), (3.0, 2.0, 120, 5)],
                        # still filling 30 minutes after the pump starts
                        lambda diameter, height, rate, pct:
                        3.1416 * (diameter / 2) ** 2 * height * 1000 * (1 - pct / 100) > 30 * rate),
    "garden_path": math_template("length width path gravel turf", """A rectangular garden is {length} m by {width} m. A
        gravel path {path} m wide is laid along the inside of all four edges. Gravel for the path costs ${gravel} per
        square metre and turf for the rest costs ${turf} per square metre. What will the materials cost?""",
                         [(20, 12, 1.5, 18, 7), (15, 9, 1, 22, 6.5), (30, 18, 2, 15, 8), (12, 8, 0.8, 25, 9)],
                         lambda length, width, path, gravel, turf: 2 * path < width <= length),
    "ladder_slip": math_template("ladder foot slip", """A {ladder} m ladder leans against a wall with its foot {foot}
        m from
        the wall. The foot slips {slip} m further out on a wet floor. How far does the top slide down the wall, and
        what angle does the ladder make with the ground before and after?""",
                         [(6, 1.5, 0.5), (5, 1.2, 0.8), (8, 2, 1), (4, 1, 0.6)],
                         lambda ladder, foot, slip: foot + slip < ladder),
    "pizza_value": math_template("d1 p1 d2 p2 side p3", """A pizzeria sells a {d1}-inch round pizza for ${p1}, a
        {d2}-inch
        round pizza for ${p2} and a {side}-inch square pizza for ${p3}. Which gives the most pizza per dollar, and
        how many of the smallest pizzas would match one of the largest in area?""",
                         [(10, 9, 14, 15, 12, 17), (8, 7, 16, 18, 12, 16), (12, 11, 18, 21, 14, 19),
                          (9, 8, 15, 16, 11, 14)]),
    "latency_sample": math_template("label data", """These are the response times in milliseconds of {label} requests
        to an
        internal service: {data}. Find the mean, the median, the sample standard deviation and the interquartile
        range, and say which values count as outliers under the 1.5 x IQR rule.""",
                            [("twelve", "42, 38, 51, 40, 45, 39, 220, 44, 41, 47, 43, 40"),
                             ("ten", "120, 95, 101, 99, 110, 97, 430, 105, 98, 102"),
                             ("eleven", "8, 9, 7, 10, 8, 9, 11, 8, 60, 9, 10"),
                             ("nine", "310, 295, 305, 330, 290, 300, 315, 298, 870")]),
    "two_classes": math_template("na ma sa nb mb sb", """Two classes sat the same maths test. Class A has {na}
        students with
        a mean of {ma} and a standard deviation of {sa}; class B has {nb} students with a mean of {mb} and a
        standard deviation of {sb}. What are the mean and the standard deviation of all the students together?""",
                         [(24, 68, 10, 30, 74, 8), (18, 55, 12, 22, 61, 15), (30, 72, 9, 25, 70, 11),
                          (20, 81, 6, 28, 77, 7)]),
    "food_truck": math_template("fixed price cost days sold", """A food truck has fixed costs of ${fixed} a month. A
        meal
        sells for ${price} and costs ${cost} in ingredients and packaging. The truck opens {days} days a month. How
        many meals a day does it need to break even, and what is the monthly profit at {sold} meals a day?""",
                        [(6800, 12, 4.5, 24, 50), (9200, 14, 5, 26, 60), (4500, 9.5, 3.8, 22, 35),
                         (12000, 16, 6.5, 25, 75)],
                        lambda fixed, price, cost, days, sold: cost < price),
    "subscription_payback": math_template("build monthly price churn cac", """A small software product cost ${build} to
        build and costs ${monthly} a month to run. Customers pay ${price} a month, {churn}% of them cancel each month,
        and winning a customer costs ${cac} in marketing. What is a customer's expected lifetime value after the
        marketing cost, and how many paying customers cover the running costs?""",
                                  [(60000, 2500, 29, 4, 120), (25000, 900, 12, 6, 40), (150000, 8000, 99, 2.5, 600),
                                   (40000, 1500, 19, 5, 70)],
                                  lambda build, monthly, price, churn, cac: price / (churn / 100) > cac),
    "transfer_fees": math_template("amount rate spread fixed pct", """A freelancer is paid {amount} euros by a
        client. Her
        bank converts at the mid-market rate of {rate} dollars per euro minus a {spread}% margin and charges a ${fixed}
        fee; a transfer service uses the mid-market rate and charges {pct}% of the amount. Which is cheaper, and at
        what payment size do the two cost the same?""",
                           [(2400, 1.08, 2.5, 15, 0.9), (800, 1.10, 3, 10, 1.2), (5000, 1.07, 1.8, 25, 0.6),
                            (1500, 1.12, 2.2, 12, 1.0)],
                           lambda amount, rate, spread, fixed, pct: spread > pct),
    "tax_bands": math_template("b1 b2 r1 r2 income rise", """In a country, the first {b1} of income a year is tax-free,
        income above that up to {b2} is taxed at {r1}%, and income above {b2} at {r2}%. Alex earns {income} and is
        offered a raise of {rise}. What is Alex's tax before and after the raise, the average and marginal rates in
        each case, and how much of the raise Alex keeps?""",
                       [(12500, 50000, 20, 40, 48000, 5000), (10000, 40000, 22, 35, 38500, 4000),
                        (15000, 70000, 18, 42, 66000, 9000), (8000, 30000, 15, 30, 27000, 2500)],
                       lambda b1, b2, r1, r2, income, rise: b1 < b2 and r1 < r2),
    "cycle_average": math_template("up v_up v_down flat v_flat", """A cyclist rides {up} km uphill at {v_up} km/h,
        comes back
        down the same road at {v_down} km/h, then rides {flat} km on the flat at {v_flat} km/h. What was the average
        speed over the entire ride, and why is it not the average of the three speeds?""",
                         [(12, 14, 40, 20, 27), (8, 10, 36, 15, 25), (20, 16, 45, 30, 28), (5, 9, 30, 10, 22)]),
    "reorder_quantity": math_template("demand unit order hold disc qmin", """A shop sells {demand} units a year of a
        product
        that costs it ${unit}. Placing an order costs ${order}, and holding a unit for a year costs {hold}% of its
        price. The supplier offers {disc}% off orders of at least {qmin} units. How many should the shop order each
        time, and is the discount worth taking?""",
                              [(3600, 8, 50, 25, 3, 1000), (12000, 2.5, 80, 20, 2, 3000),
                               (900, 40, 60, 30, 5, 200), (5200, 15, 45, 22, 4, 800)]),
}
MATH_ASKS: dict[str, str] = {
    "worked": "Give the worked solution with units at every step, then sanity-check the result with a rough "
              "estimate.",
    "formula": "Work through it one step at a time, then write a general formula in terms of the named "
               "quantities and show that it reproduces your answer.",
    "backwards": "Work it out, state the answer clearly, and verify it by working backwards from your answer.",
    "struggling": "Explain the solution for a reader who finds this kind of problem hard: name the idea being "
                  "used, do the calculation, and point out the mistake people most often make here.",
    "sensitivity": "Solve it, then say which single number in the problem the answer is most sensitive to, and "
                   "show how much the answer moves if that number changes by 10%.",
    "spreadsheet": "Solve it, then describe how you would set it up in a spreadsheet (which cells and which "
                   "formulas) so that the numbers can be changed later.",
    "two_ways": "Solve it in two different ways and show that both give the same answer, then say which way you "
                "would use again and why.",
    "table_steps": "Solve it and present the intermediate quantities in a small table, then state the final answer "
                   "in one sentence.",
    "units_check": "Work through it step by step, checking that the units agree at each step, and round only at "
                   "the end.",
    "teach": "Teach me how to solve it: say what to work out first and why, do each step, and finish with a similar "
             "practice question of your own with its answer.",
}


# --- writing ----------------------------------------------------------------------------------

DOCUMENTS: dict[str, str] = {
    "decline_talk": """an email to Dr Helen Okafor declining her invitation to speak at the Regional Data Science
        Meetup on 14 November. Reason: your team is in the middle of a product launch that week. Offer instead that
        Marco Ruiz, a senior analyst, could give a talk on the same topic, or that you could speak at the spring
        meetup in March.""",
    "outage_notice": """an incident notice to the customers of Parcelry, a shipping-label service. On Tuesday from
        09:40 to 11:15 UTC, label creation failed for about 35% of requests because a database failover took longer
        than expected. No data was lost, and labels requested during the outage were not charged. A second database
        replica and a faster failover check have since been added.""",
    "migration_update": """a project update for the steering group of the Atlas CRM migration. Facts: 14,000 of
        20,000 accounts are migrated; the remaining 6,000 include 1,200 with duplicate records that need manual
        review; go-live moves from 3 June to 17 June; $182,000 of the $240,000 budget is spent; the open risk is
        that training for the sales team is not yet scheduled.""",
    "shoe_listing": """a product description for the Kestrel 2 trail running shoe: 265 g in a men's size 9, a 6 mm
        heel-to-toe drop, 4 mm lugs, a recycled mesh upper and a rock plate; sizes 6 to 14; $139; in slate grey or
        ember orange.""",
    "analyst_application": """a cover letter from Jordan Lee for a junior data analyst job at Greenfield Energy.
        Jordan has a biology degree and two years as a lab technician, taught themself SQL and Python, built a
        dashboard tracking 40 lab instruments that cut instrument downtime by 15%, and is moving to Leeds in
        September.""",
    "planning_notes": """a meeting summary with decisions and action items, from these notes: "Q3 planning. Mia,
        Raj, Tom, Lena. Mobile release slips 2 wks, API not ready. Agreed: feature freeze 1 Aug. Raj drafts hiring
        plan for 2 QA roles by Fri. Tom worried about on-call load, 9 pages last wk. Lena brings customer survey
        results next time. Budget question open, needs CFO." """,
    "plain_db_notice": """a rewrite, for customers who are not technical, of this paragraph: "Due to increased p99
        latency on our primary Postgres cluster, we are migrating read-heavy workloads to replicas and introducing
        connection pooling via PgBouncer. During the maintenance window, write operations may experience elevated
        error rates." """,
    "plain_lease_clause": """a plain-English version, for tenants, of this clause: "The Lessee shall, at the
        Lessee's sole cost and expense, keep the Premises in good and tenantable repair, fair wear and tear
        excepted, and shall hold the Lessor harmless from all claims arising from any failure so to do." """,
    "gym_price_rise": """an email to the 300 members of Riverside Climbing Gym announcing that the monthly membership
        rises from $65 to $72 on 1 September, the first rise in four years. Reasons: energy costs up 40%, new
        auto-belays and a second bouldering wall. Members who pay for a year before 31 August keep the old rate for
        that year.""",
    "reference_amira": """a reference letter for Amira Haddad, who worked for you for three years as a support team
        lead at a software company: she managed six people, cut the average first response time from 9 hours to 2,
        and wrote the team's onboarding guide. She is applying to be a customer success manager.""",
    "late_sofa_reply": """a reply to a customer, Daniel Price, whose sofa (order 48213) arrived 12 days late with a
        torn cushion cover. Offer a replacement cover shipped within five working days, a refund of the $89 delivery
        charge, and a direct line to a named contact, Sofia, on 555-0142.""",
    "bookkeeper_ad": """a job advertisement for a part-time (20 hours a week) bookkeeper at Hollis & Grant, a
        15-person architecture practice in Bristol: must know Xero, VAT returns and payroll; £16,000 to £18,000 for
        the part-time hours; two office days a week, the rest from home; apply by 30 April.""",
    "repair_cafe_grant": """a grant application summary for Fix-It Fridays, a free weekly repair café in Dunmore
        library run by 12 volunteers. Last year it repaired 480 items (62% of those brought in) and kept about 1.4
        tonnes out of landfill. The request is £7,500 for tools, insurance and a part-time coordinator for one
        year.""",
    "work_abroad_policy": """a short policy on working from abroad for a 60-person company: up to 20 working days a
        year; the manager must approve two weeks in advance; not allowed in sanctioned countries; the employee must
        be reachable from 10:00 to 16:00 UK time; tax questions go to HR.""",
    "school_lunch_item": """a headteacher's newsletter item for parents about school lunches: from 6 January they
        are ordered through the ParentPay app by 09:00 on the day; the price stays at £2.60; free school meals are
        not affected; parents without a smartphone can order at the school office.""",
    "ledgerly_notes": """release notes for version 2.8 of Ledgerly, a bookkeeping app: bank feeds for Monzo,
        Starling and Revolut; CSV export now includes VAT codes; invoices can be scheduled to go out monthly; fixed
        a bug where reports rounded totals to whole pounds; support for Internet Explorer 11 is removed.""",
    "renewal_decision": """an email asking your manager for a decision: the support-tool vendor will raise its price
        from $18,000 to $27,000 a year at renewal on 1 March. Options: accept; sign a two-year deal (the vendor hinted
        at $23,000 a year); or move to a competitor at $15,000 a year plus about six weeks of one engineer's
        time.""",
    "midyear_feedback": """mid-year written feedback for Kai, a mid-level engineer. Strengths: led the payment-retry
        redesign that cut failed payments by 30%, and reviews code carefully. To improve: estimates are often off by
        a factor of two, and stand-up updates are hard to follow. Goal: lead one cross-team project by the end of
        the year.""",
    "boiler_letter": """a letter to a landlord, Ms Carla Benn, asking for a repair: the boiler at Flat 3, 22 Mill
        Road has failed three times since 10 October; the flat has had no hot water for four days; an engineer who
        visited on 2 November said the pressure valve must be replaced. Ask for the repair within seven days and
        refer to the repair clause of the tenancy agreement.""",
    "open_lab_invite": """an invitation to an open day at the Marlow Institute's robotics lab: Saturday 12 October,
        10:00 to 15:00, free, for ages 10 and up with an adult; demonstrations of a walking robot and a drone
        obstacle course; booking required, since places are limited to 150; parking at the north gate.""",
    "welcome_noor": """a welcome message for Noor, a designer joining a nine-person product team on Monday: the first
        day starts at 09:30 at the front desk; her laptop is ready; her buddy is Oskar; the first week includes a
        meeting with each product manager and a walk-through of the design system; lunch on Friday is on the
        team.""",
    "refund_refusal": """a reply declining a refund: Emma Walsh asked for a full refund of her $240 annual plan after
        five months, but the terms allow refunds within 30 days. Offer to switch her to monthly billing from the
        next renewal or to add two months of credit, and keep her goodwill.""",
    "walking_trial_news": """a short news piece for a general audience based on this abstract: "In a randomised
        trial of 412 adults aged 60 to 75 with stage 1 hypertension, a 12-week walking programme lowered systolic
        blood pressure by a mean of 6.1 mmHg (95% CI 3.9 to 8.3) compared with usual care." """,
    "charity_year": """a summary of a charity's year for its board: income of £1.2 million, up 8%; 3,400 families
        supported, up from 2,900; a new food bank opened in Hartley in May; volunteer numbers fell from 210 to 170;
        reserves cover four months of costs against a target of six.""",
    "office_move": """an announcement to 120 staff that the office moves from 14 Harbour Street to the fourth floor
        of Quay House, five minutes' walk away, over the weekend of 22 and 23 March: pack your desk by Friday at
        17:00; new access cards are handed out at reception on Monday; parking drops from 40 spaces to 25; a bike
        store is added.""",
    "bid_not_chosen": """an email to Tarek at BrightPath Analytics saying their proposal for the customer-survey
        project was not chosen: three bids came in; the chosen one was about 20% cheaper and could start two weeks
        earlier; you valued BrightPath's sector experience and would like to invite them to bid for next year's
        panel study.""",
    "speaker_bio": """a speaker biography for Dr Lucia Ferreira, a hydrologist at the University of Coimbra who
        studies drought in southern Europe, led a five-country groundwater project, has published 40 papers and
        advises Portugal's environment agency. Her talk is called "Where the Water Went".""",
    "lift_works": """a notice to the residents of Elm Court: the lift in Block B is out of service from Monday 4 to
        Friday 15 March for a full replacement; the stairs stay open; residents with mobility needs can register for
        help with deliveries by calling the office on 555-0199; work happens from 08:00 to 17:00.""",
    "meeting_change": """an email proposing to your team lead that the weekly 90-minute status meeting become a
        20-minute meeting plus a written update. Facts: nine people attend, so it costs about 13.5 person-hours a
        week; in a poll, seven of the nine preferred written updates; you suggest a six-week trial.""",
    "shelter_thanks": """a thank-you letter to the donors of Westbrook Animal Shelter: the winter appeal raised
        $48,300 from 612 donors against a target of $40,000; the money pays for a new isolation ward for sick animals,
        opening in June, and 300 vaccinations; donors are invited to the ward's opening.""",
    "price_increase_b2b": """a letter to the 140 business customers of Clearpath Payroll announcing that the monthly fee
        rises from $6 to $7.50 per employee on 1 July; the reasons are new tax-filing features and higher hosting
        costs; customers who sign an annual plan before 1 June keep $6 for twelve months.""",
    "volunteer_call": """a call for volunteers for the Riverside Community Garden's spring planting days on Saturday
        12 and Sunday 13 April, 09:00 to 13:00; no experience is needed; gloves and tools are provided; sign up by
        replying to garden@riverside.example with the day you can come; children over ten are welcome with an
        adult.""",
    "data_breach_notice": """a notice to 2,300 users of the Fitloop app: on 3 May an attacker used a leaked staff
        password to read names, email addresses and workout histories for eleven hours; no payment details or
        passwords were exposed; the company reset all staff passwords and added two-factor sign-in; users do not
        need to do anything, but should be careful with emails asking them to log in.""",
    "conference_abstract": """a 150-word abstract for a talk at a regional software conference: the speaker's team
        cut their cloud bill by 38% in six months by right-sizing databases, deleting unused test environments and
        moving batch jobs to spot instances, without changing any product features.""",
    "tenant_repair_request": """an email from a tenant to the letting agent Hollis and Ward about a leaking kitchen
        tap at 14 Cedar Road, Flat 3, reported by phone on 2 and 16 September without a visit; the leak now stains
        the cupboard below; the tenant asks for a repair date within seven days and is at home on weekday
        mornings.""",
    "award_nomination": """a nomination of Grace Mbeki, night-shift supervisor, for her hospital's staff award: she
        cut handover errors by half with a checklist she wrote, trained 14 new nurses this year and covered 22
        extra shifts during the winter outbreak.""",
    "policy_remote_equipment": """an internal announcement of a new equipment policy: remote staff can claim up to
        $600 every three years for a desk, chair or monitor, with receipts, through the expenses system; laptops
        stay company property and are replaced every four years; the policy starts on 1 February.""",
    "event_cancellation": """an email to 85 registered attendees cancelling the Northfield Photography Club's outdoor
        workshop on 22 June because of the storm forecast; everyone gets a full refund of the $35 fee within five
        working days; the workshop is rescheduled to 6 July, with priority booking for current attendees.""",
    "product_recall": """a notice to customers of Brightnest Home about a recall of the BN-200 electric kettle sold
        between January and April: a faulty switch can fail to turn the kettle off; customers should stop using it,
        check the batch number under the base (batches 2401 to 2416), and claim a free replacement online or in any
        store.""",
    "grant_progress_report": """a one-page progress report to the Lindell Foundation on a $25,000 grant for an
        after-school coding club: 64 pupils enrolled against a target of 50, attendance averaged 81%, two volunteer
        teachers left and were replaced, and $9,200 remains for the second term.""",
    "delay_apology": """an email to a client, Mr Tomas Berg, apologising that the website redesign his firm ordered
        will be delivered on 18 October instead of 4 October because the payment integration failed security
        testing; the home and product pages are ready for review now; there is no extra charge, and a 10% discount
        applies to the next invoice.""",
    "job_ad_warehouse": """a job advertisement for a warehouse team leader at Northgate Logistics: permanent, full
        time, $52,000 a year, early shifts from 06:00 to 14:30 Monday to Friday; leading a team of twelve; a forklift
        licence is needed and training for the rest is given; apply by 30 November with a short CV.""",
    "scholarship_letter": """a letter telling Aisha Rahman that she has won the Hartley Engineering Scholarship of
        $4,000 a year for three years; she must keep an average grade of B or higher, attend one mentoring meeting
        a term, and confirm her acceptance by 15 August.""",
    "parking_rule_change": """a notice to staff of Greenfield Hospital: from 1 March the staff car park is for
        permit holders only; permits cost $15 a month, taken from salary; night-shift staff park free; applications
        open on 1 February on the staff portal; cars without a permit will be fined $60.""",
    "survey_results_summary": """a summary for the whole company of the annual staff survey: 412 of 530 staff
        answered; 78% would recommend the company as a place to work, up from 71%; the lowest score was for career
        development at 52%; the leadership team will publish an action plan by the end of next month.""",
    "tenant_rent_increase": """a letter from a landlord to the tenants of 22 Harbour Street, Flat 5, raising the
        rent from $1,150 to $1,210 a month from 1 September, giving the reasons (a 9% rise in building insurance and
        new double glazing), and stating that the tenants may discuss it or give notice under the lease.""",
    "newsletter_library": """a short newsletter item for the Eastvale Library: from 1 May the library lends laptops
        for up to two weeks to anyone with a library card; 20 laptops are available; they can be reserved online
        or at the desk, and a late return costs $2 a day.""",
    "supplier_complaint": """a complaint to the supplier PackRight about three deliveries in a row of cardboard
        boxes that arrived crushed (orders 5521, 5578 and 5610, about 15% of boxes unusable); ask for credit of $840
        and for the pallets to be wrapped, and say that the contract will be reviewed in January.""",
}
STYLE_RULES: dict[str, str] = {
    "under_200": "Keep it under 200 words.",
    "warm_direct": "Use a warm but direct tone, with no exclamation marks and no stock phrases.",
    "bullets": "Open with a short paragraph, put the key facts in bullet points, and close with one line.",
    "simple_english": "Write for readers whose first language is not English: short sentences and common words.",
    "formal_exact": "Make it formal and precise, and keep every number and date exactly as given.",
    "no_jargon": "Avoid jargon; where a technical term is needed, explain it in a few words.",
    "three_paragraphs": "Use exactly three paragraphs: the news, the details, and what happens next.",
    "friendly_brief": "Keep it friendly and brief, around 120 words, and end with a clear next step.",
    "active_voice": "Write in the active voice, put the most important fact in the first sentence, and leave out "
                    "filler.",
}
WRITING_EXTRAS: dict[str, str] = {
    "title_first": "Give it a subject line or title first.",
    "cut_two": "After the draft, name the two sentences you would cut first if it had to be shorter.",
    "half_length": "Then write a second version at half the length.",
    "missing_fact": "After the draft, point out one fact the reader would probably ask about that is missing.",
    "sceptic_reply": "Then write the reply you would expect from the most sceptical reader.",
    "explain_order": "After the draft, explain in two or three sentences why you ordered the information as you "
                     "did.",
}
WRITING_TEMPLATES: tuple[str, ...] = ("Write {a}\n\n{b} {c}", "Please draft {a}\n\n{b} {c}",
                                      "I need {a}\n\n{c} {b}")


# --- coding -----------------------------------------------------------------------------------

SPECS: dict[str, str] = {
    "parse_duration": """a function parse_duration(text) -> int that turns strings such as "1h30m", "45s", "2h" and
        "1h5m30s" into a number of seconds. Examples: "1h30m" gives 5400, "90s" gives 90, "2h" gives 7200. Reject
        empty strings, unknown units ("3d"), a unit that appears twice ("1h2h") and negative numbers, each with a
        clear error.""",
    "room_conflicts": """a function find_conflicts(bookings) -> list of pairs, where each booking is (room,
        start_minute, end_minute, booking_id), returning every pair of ids that overlap in the same room. Example:
        [("A", 540, 600, "b1"), ("A", 590, 650, "b2"), ("B", 540, 600, "b3")] gives [("b1", "b2")]. Bookings that
        only touch (one ends at 600, the next starts at 600) do not conflict. It must run in O(n log n + k) time for
        k conflicts.""",
    "semver_compare": """a function compare_versions(a, b) -> int returning -1, 0 or 1 for semantic versions, so
        that "1.10.0" against "1.9.3" gives 1 and "2.0.0-rc.1" against "2.0.0" gives -1. Follow semver precedence for
        pre-release tags ("alpha" < "alpha.1" < "beta" < "rc.1"), ignore build metadata after "+", and reject
        numbers with leading zeros such as "01.2.3".""",
    "csv_dedupe_cli": """a command-line tool dedupe that reads CSV from standard input and writes it to standard
        output without rows whose value in a given column (--key email) repeats an earlier row's, compared
        case-insensitively and ignoring surrounding spaces. The header is kept. Quoted fields may contain commas and
        newlines. If the column does not exist, exit with status 2 and a message on standard error.""",
    "sliding_limiter": """a class SlidingWindowLimiter(limit, window_seconds) with allow(client_id, now) -> bool that
        allows at most limit calls per client in any window of window_seconds. Example with limit 3 and window 10:
        calls at t = 0, 1 and 2 are allowed, t = 3 is refused, t = 10.5 is allowed. Memory per client must stay
        O(limit), and clients idle for longer than the window must be forgotten.""",
    "split_bill": """a function split_amount(total_cents, weights) -> list of int that splits an amount in proportion
        to integer weights so that the parts add up exactly to the total, giving leftover cents to the largest
        remainders first and ties to the earlier person. Examples: (1000, [1, 1, 1]) gives [334, 333, 333]; (500,
        [3, 1]) gives [375, 125]. Reject negative totals, an empty list and weights that are all zero.""",
    "access_log_summary": """a function summarise_log(lines) -> dict for access-log lines such as
        "2024-05-01T12:00:03Z GET /api/items 200 35ms", returning the number of requests, the share of responses
        with status 500 or above, and the median and 95th-percentile latency per path. Malformed lines are counted
        and skipped, never fatal.""",
    "text_wrap": """a function wrap(text, width) -> list of lines that breaks text at spaces into lines of at most
        width characters, keeps blank lines as paragraph breaks, and splits a word longer than width with a hyphen at
        the end of each piece. Example: wrap("the quick brown fox", 10) gives ["the quick", "brown fox"].""",
    "json_changes": """a function json_diff(old, new) -> list of changes comparing two parsed JSON values. Each change
        is (path, kind, old_value, new_value), kind is "added", "removed" or "changed", and paths look like
        "items[2].price". Lists are compared by index. Example: {"a": 1, "b": [1, 2]} against {"a": 2, "b": [1]}
        gives [("a", "changed", 1, 2), ("b[1]", "removed", 2, null)].""",
    "cron_next": """a function next_run(expr, after) -> datetime for five-field cron expressions (minute, hour, day
        of month, month, day of week) with "*", lists ("1,15"), ranges ("9-17") and steps ("*/15"), returning the
        first matching minute strictly after the given time. Example: "*/15 9-17 * * 1-5" after Friday 17:50 gives
        the following Monday at 09:00. Invalid fields raise an error that names the field.""",
    "expiring_cache": """a cache class with get(key), set(key, value, ttl_seconds) and a maximum size. Expired
        entries are never returned; when the cache is full, the entry that expires soonest is evicted. Every
        operation must be O(log n), and the clock must be injectable so tests can control time.""",
    "bank_reconcile": """a function reconcile(ledger, statement) -> report that matches ledger entries to bank
        statement lines with the same amount (integer cents) and a date no more than three days apart. Each line
        is used at most once, the closest date wins, and the report lists what is unmatched on each side.""",
    "markdown_toc": """a function table_of_contents(markdown) -> str that builds a nested bullet list of links from
        the "#", "##" and "###" headings of a Markdown document. Anchors follow GitHub's rules (lower case, spaces
        to hyphens, punctuation dropped, "-1", "-2" added for repeats), and headings inside fenced code blocks are
        ignored.""",
    "password_rules": """a function check_password(password, username) -> list of problems enforcing: at least 12
        characters; must not contain the user name in any letter case; must not be in a supplied list of 10,000
        common passwords; no character repeated more than three times in a row. Return every problem, not only the
        first; an empty list means the password is acceptable.""",
    "grid_paths": """a function count_paths(grid) -> int for a grid of "." (open) and "#" (wall) cells, counting
        the paths from the top-left to the bottom-right cell that move only right or down, modulo 1,000,000,007.
        Example: ["..", ".."] gives 2. Handle a blocked start or end, and grids up to 1,000 by 1,000 in
        O(rows x cols) time and O(cols) memory.""",
    "stock_reservations": """a class Inventory with add(sku, quantity), reserve(order_id, items) -> bool,
        release(order_id) and available(sku), where items maps SKUs to quantities. A reservation is all or nothing,
        an order id can reserve only once, and quantities never go negative. It must be safe to use from several
        threads at once.""",
    "expression_eval": """a function evaluate(expression) -> number for arithmetic with +, -, *, /, parentheses,
        unary minus and decimal numbers, with the usual precedence, written without eval or a parser library.
        Example: "2 * (3 + 4) - -1" gives 15. For malformed input such as "2 * (3 +", report the position of the
        first error.""",
    "duplicate_files": """a command-line tool that finds duplicate files under a directory: group by size, then by a
        hash of the first 4 KB, then by a full SHA-256, and print each group with the file size. Skip symbolic links,
        warn about unreadable files and carry on, and handle 100,000 files without reading a whole file into
        memory.""",
    "iban_check": """a function validate_iban(text) -> bool that accepts IBANs with or without spaces, checks the
        length for at least GB (22 characters), DE (22), FR (27) and NL (18), and verifies the mod-97 checksum.
        Example: "GB82 WEST 1234 5698 7654 32" is valid.""",
    "text_histogram": """a function ascii_histogram(values, bins, width) -> str that prints a horizontal histogram,
        one line per bin with its range on the left and a bar of "#" scaled so that the largest bin is width
        characters, followed by the count. Example line: "[10.0, 20.0)  ######## 8". Handle an empty list, values
        that are all equal, and negative numbers.""",
    "stream_dedupe": """a component that removes duplicate events from a stream by event id, where a repeated id
        can arrive up to ten minutes after the first copy. Events must come out in arrival order, and memory must
        stay bounded at 5,000 events a second. Give it a push(event) -> bool interface.""",
    "slugify": """a function slugify(title, max_length=60) -> str that lowercases, turns common accented letters
        into plain ones ("é" to "e", "ß" to "ss"), replaces each run of characters other than letters and digits
        with one hyphen, trims hyphens at both ends, and cuts at a word boundary within max_length. Example:
        "Crème Brûlée: 10 Tips!" gives "creme-brulee-10-tips".""",
    "largest_island": """a function largest_island(grid) -> int returning the area of the largest group of 1s
        connected up, down, left or right in a grid of 0s and 1s. It must not use recursion, since grids can be
        2,000 by 2,000, and it must not modify its input.""",
    "config_merge": """a function merge_config(base, override) -> dict that deep-merges nested dictionaries: nested
        dictionaries merge recursively, a list in override replaces the list in base, a null value in override
        deletes the key, and neither input is changed. Example: {"db": {"host": "a", "port": 5432}} merged with
        {"db": {"host": "b"}} gives {"db": {"host": "b", "port": 5432}}.""",
    "common_free_time": """a function free_slots(busy, day_start, day_end, min_minutes) -> list that takes several
        people's busy intervals as "HH:MM-HH:MM" strings and returns the free intervals they share that last at
        least min_minutes. Example: busy [["09:00-10:30"], ["10:00-11:00", "13:00-14:00"]], day 09:00 to 17:00,
        60 minutes gives ["11:00-13:00", "14:00-17:00"].""",
    "run_length": """functions encode(s) and decode(s) for run-length encoding, where a run is written as its count
        followed by the character ("aaab" becomes "3a1b"), digits and backslashes in the input are escaped with a
        backslash, and decode(encode(s)) equals s for every string, including the empty one.""",
    "cursor_pages": """a function paginate(items, page_size, cursor) -> (page, next_cursor) over items sorted by
        (created_at, id), with an opaque base64 cursor that encodes the last item's sort key, so that pages stay
        correct when new items are added at the front. next_cursor is null on the last page, and an invalid cursor
        raises an error.""",
    "ranked_board": """a class Leaderboard with submit(player, score), which keeps each player's best score,
        top(k) -> list and rank(player) -> int, where equal scores share a rank (1, 2, 2, 4). submit and rank must be
        O(log n) for a million players.""",
    "units_convert": """a function convert(quantity, to_unit) -> str for inputs such as "5 ft 11 in", "72 kg", "3.5
        lb" and "180 cm", converting between metric and imperial lengths and masses, rounding to one decimal place,
        and refusing to convert a length into a mass. Example: convert("5 ft 11 in", "cm") gives "180.3 cm".""",
    "ini_reader": """a parser that reads INI text into a dictionary of sections. It supports "[section]" headers,
        "key = value" pairs, comments starting with ";" or "#", values continued on indented lines, and repeated
        keys (the last one wins, with a warning). Keys that come before any section go into a section called
        "default".""",
    "roman_numerals": """a pair of functions to_roman(n) and from_roman(text) for whole numbers from 1 to 3999.
        Examples: 1994 gives "MCMXCIV", "XLII" gives 42. from_roman must reject malformed numerals such as "IIII",
        "VX" or "MCMC" with a clear error, and to_roman must reject numbers outside the range.""",
    "invoice_totals": """a function invoice_totals(lines, tax_rates) that takes invoice lines (description, quantity,
        unit price in cents, tax code) and a mapping from tax code to rate, and returns the subtotal, the tax per
        code and the total, all in whole cents, rounding each tax amount half up once per code rather than per
        line. An unknown tax code must raise an error naming the line.""",
    "trie_autocomplete": """a class Autocomplete built from a list of (word, frequency) pairs, with suggest(prefix,
        k) returning the k most frequent words that start with the prefix, ties broken alphabetically, and
        add(word, frequency) to add or update a word. Prefix matching ignores case, but suggestions keep the
        original spelling.""",
    "retry_backoff": """a function retry(operation, attempts, base_delay, max_delay) that calls operation until it
        succeeds or attempts run out, waiting base_delay, then twice that, and so on up to max_delay, with random
        jitter of up to half of each delay. Only errors marked as retryable are retried; any other error is raised
        at once. The waiting must be injectable so that tests run instantly.""",
    "matrix_spiral": """a function spiral(matrix) that returns the elements of a rectangular matrix in clockwise
        spiral order starting at the top-left corner. Examples: [[1,2,3],[4,5,6],[7,8,9]] gives
        [1,2,3,6,9,8,7,4,5]; a single row or column comes back in order; an empty matrix gives an empty list; rows
        of unequal length raise an error.""",
    "time_slots": """a function free_slots(busy, day_start, day_end, length) that takes a list of busy intervals
        (start and end times as "HH:MM" strings, possibly overlapping and unsorted) and returns every free slot of
        at least length minutes between day_start and day_end, merged and sorted.""",
    "word_frequency_cli": """a command-line tool that prints the 20 most common words in one or more text files,
        with their counts, ignoring case and punctuation and skipping words from an optional stop-word file given
        with --stop. Files that cannot be read are reported on standard error, and the others are still
        counted.""",
    "bank_ledger": """a class Ledger that records deposits, withdrawals and transfers between named accounts, keeps
        every balance in whole cents, refuses any withdrawal or transfer that would make a balance negative, and
        can report the balance of an account as of any past timestamp.""",
    "url_parser": """a function parse_url(text) that breaks a web address into its parts: the scheme, the host
        name, the port number, the path, the query parameters (a mapping from name to a list of values,
        percent-decoded) and the fragment. Missing parts come back empty, the default port follows from http or
        https, and an address without a scheme or host raises an error.""",
    "priority_tasks": """a class TaskQueue where tasks have a priority from 1 to 5 and a due time, with push(task),
        pop() returning the most urgent task (highest priority first, then earliest due time, then the order
        pushed), and peek_overdue(now) listing every task already past its due time without removing it.""",
    "luhn_check": """a function valid_card_number(text) that checks a card number with the Luhn algorithm. Spaces
        and dashes between groups are allowed and ignored, any other character makes the number invalid, and only
        numbers of 12 to 19 digits are accepted. Examples: "4539 1488 0343 6467" is valid; "8273 1232 7352 0569" is
        not.""",
    "moving_average": """a class MovingAverage(window) with add(value) that returns the average of the last window
        values added so far (fewer at the start), in constant time per call. It must reject a window smaller than
        1 and values that are not finite numbers.""",
    "balanced_brackets": """a function first_unbalanced(text) that checks round, square and curly brackets and
        returns the position of the first bracket that has no partner, or None when all are balanced. Brackets
        inside double-quoted strings are ignored, and a backslash escapes the next character inside a string.""",
    "date_ranges": """a function merge_bookings(bookings) that takes hotel bookings as (room, check-in date,
        check-out date) and returns, for each room, the merged occupied ranges, treating a check-out and a check-in
        on the same day as back to back, not overlapping. A booking that ends before it starts raises an error.""",
    "template_render": """a function render(template, values) for templates such as "Hello {{ name }}, you have {{
        count }} new messages". Unknown names raise an error that names them, a backslash before "{{" writes the
        braces literally, and whitespace inside the braces is ignored.""",
    "top_k_words_stream": """a class TopWords(k) that reads text in chunks through feed(chunk), where a word may be
        split across two chunks, and returns the k most frequent words so far through top(), ignoring case and ties
        broken alphabetically.""",
}
CODE_LANGUAGES: dict[str, str] = {
    "python": "Python", "typescript": "TypeScript", "go": "Go", "rust": "Rust", "java": "Java",
    "cpp": "C++", "csharp": "C#", "kotlin": "Kotlin",
}
CODING_ASKS: dict[str, str] = {
    "with_tests": "Give the implementation, then unit tests that cover every example and edge case above, using the "
                  "language's usual test framework.",
    "approach_first": "Start with a short explanation of the approach and its time and space complexity, then the "
                      "code, then tests for the edge cases.",
    "stdlib_only": "Use only the standard library. After the code, list the edge cases you handle and show a test "
                   "for each.",
    "tests_first": "Write the tests first, as in test-driven development, then an implementation that passes them, "
                   "then a paragraph on what you would add before using it in production.",
    "shared_codebase": "Write it as if it were going into a shared codebase, with clear names, doc comments and "
                       "helpful error messages. Then add tests and point out one input on which it is slower than "
                       "it could be.",
    "two_pitfalls": "Give the code, then review it as a careful colleague would: name two bugs people often write "
                    "in a function like this, show how your version avoids them, and add a test for each.",
    "simple_then_better": "First write the simplest version that works, then an improved one, and explain what "
                          "changed and why. Finish with tests for the edge cases.",
}
CODING_TEMPLATES: tuple[str, ...] = (
    "Implement {a} Use {b}, adapting names and types to its conventions. {c}",
    "In {b}, write {a} Adapt the names to {b} style. {c}",
    "I need {a} Please write it in {b}, with names and types in {b} style. {c}",
)


# --- system design ----------------------------------------------------------------------------

SYSTEMS: dict[str, str] = {
    "clinic_booking": "an appointment-booking system for a chain of 40 physiotherapy clinics, where patients book "
                      "online and staff manage therapists' calendars",
    "parcel_tracking": "a parcel-tracking service that ingests scan events from depots and vans and shows customers "
                       "where their parcel is",
    "expense_claims": "an expense app where employees photograph receipts, the amounts are read automatically, and "
                      "managers approve the claims",
    "smart_meters": "a platform that collects readings from smart electricity meters every 15 minutes and bills "
                    "households monthly",
    "school_gradebook": "a gradebook in which teachers enter marks and comments and parents and pupils see them",
    "table_ordering": "an ordering system where restaurant guests order from a QR code at the table and the "
                      "kitchen sees tickets",
    "hosted_ci": "a continuous-integration service that runs customers' build jobs in isolated containers",
    "loyalty_points": "a loyalty-points system for a retail chain, with points earned at the till and online and "
                      "spent on rewards",
    "shared_editor": "a document editor in which several people edit the same text at the same time",
    "task_scheduler": "a hosted scheduler that runs customers' cron-like jobs at the right minute and records "
                      "every run",
    "fraud_scoring": "a fraud-scoring service that scores each card payment before it is approved",
    "library_loans": "a catalogue and loans system for a network of public libraries, with holds and renewals",
    "bike_sharing": "a bike-sharing system with docking stations, unlocking from an app, and per-minute billing",
    "helpdesk": "a customer-support ticketing system with email intake, automatic assignment and response-time "
                "targets",
    "exam_platform": "an online exam platform that runs timed tests for students and grades them",
    "warehouse_picking": "a warehouse system that assigns picking tasks to workers with handheld scanners",
    "message_preferences": "a service that sends email, SMS and push messages while respecting each user's "
                           "preferences and quiet hours",
    "recipe_site": "a recipe site with search by ingredient, ratings and saved shopping lists",
    "leave_requests": "a leave-request and approval system with holiday balances that follow each country's rules",
    "fridge_monitoring": "a monitoring system for pharmacy fridges that alerts staff when the temperature leaves "
                         "the safe range",
    "price_alerts": "a price-comparison site that collects shops' prices every day and alerts users to price "
                    "drops",
    "podcast_hosting": "a podcast hosting service that stores audio, serves RSS feeds and counts downloads",
    "staff_voting": "an internal tool for staff surveys and elections that must keep individual votes secret",
    "parking_payments": "a parking-payment app for city car parks, with number-plate recognition at the barriers",
    "ticket_resale": "a ticket-resale marketplace for concerts where fans list tickets, buyers pay, and each ticket is "
                     "transferred exactly once",
    "ride_hailing": "a ride-hailing dispatch service that matches riders with nearby drivers and tracks each trip",
    "url_shortener": "a link-shortening service with custom aliases, expiry dates and click statistics",
    "photo_sharing": "a photo-sharing app where users upload pictures, follow friends and see a feed of new posts",
    "telemetry_ingest": "a pipeline that ingests telemetry from factory machines every second and shows live "
                        "dashboards and alerts",
    "online_auctions": "an online auction site where bids arrive until a closing time and the highest valid bid wins",
    "vaccination_booking": "a regional booking system for vaccination appointments across 120 clinics with limited "
                           "daily doses",
    "chat_support_widget": "a live-chat widget that shop websites embed, routing visitors to available support agents",
    "feature_flags": "a service that lets product teams switch features on for chosen users or a share of traffic "
                     "without a deploy",
    "invoice_processing": "a service that receives supplier invoices by email, extracts their fields and matches them "
                          "to purchase orders for approval",
    "food_delivery": "a food-delivery platform where customers order from restaurants and couriers pick up and "
                     "deliver the orders",
    "event_ticketing": "a ticketing system for a theatre chain that sells numbered seats and must never sell the same "
                       "seat twice",
    "home_energy_app": "an app that shows households their live energy use from a smart plug and suggests cheaper "
                       "times to run appliances",
    "research_data_portal": "a portal where a university's researchers upload large data sets, share them with "
                            "colleagues and cite them",
    "gym_membership": "a membership and class-booking system for a chain of gyms, with door access by phone",
    "car_rental": "a car-rental booking system with branches, vehicle availability, pick-up and return, and damage "
                  "reports",
}
DESIGN_SCALES: dict[str, str] = {
    "small_team": "about 2,000 daily users, peaks of 30 requests per second and 20 GB of data growing 1 GB a month, "
                  "built and run by two engineers on $1,500 a month of infrastructure",
    "one_country": "about 200,000 daily users in one country, peaks of 1,500 requests per second, 2 TB of data, a "
                   "p95 latency budget of 300 ms and a team of eight",
    "national": "five million users, peaks of 20,000 requests per second in the evening, 40 TB of data growing 30% a "
                "year and a p99 latency budget of 200 ms",
    "three_continents": "30 million users in North America, Europe and Asia, 80,000 requests per second at peak "
                        "of which about 10% are writes, and a p99 read budget of 150 ms",
    "startup_launch": "50,000 users in the first month after launch, unknown growth after that, a team of three and "
                      "a budget that must stay under $5,000 a month",
    "enterprise_tenants": "300 business customers of very different sizes, the largest with 40,000 users, 5,000 "
                          "requests per second at peak and a contractual availability of 99.95%",
}
DESIGN_REQUIREMENTS: dict[str, str] = {
    "audit_claims": "every change must go to an append-only audit log kept for seven years, and two concurrent "
                    "edits of the same record must never silently overwrite each other",
    "offline_sync": "mobile users must be able to keep working offline for up to a day, their changes must merge "
                    "when they reconnect, and no change may be lost silently",
    "region_loss": "the service must survive the loss of a whole cloud region with under five minutes of downtime "
                   "and under one minute of lost writes",
    "eu_privacy": "data about EU residents must stay in the EU, a user's data must be exportable and deletable "
                  "within 30 days, and every access to personal data must be logged",
    "spiky_deploys": "traffic can rise tenfold within two minutes after a marketing email, and deploys must never "
                     "need downtime or a maintenance window",
    "search_budget": "users need full-text search that answers in under 500 ms, and the monthly bill must stay "
                     "predictable as the data grows",
    "exactly_once": "each event must take effect exactly once even when clients retry, and operators must be able "
                    "to replay a day of events after a bug fix",
    "tenant_isolation": "one customer's heavy load must never slow down the others, and each customer's data must "
                        "be exportable on its own",
    "live_updates": "users must see changes made by others within two seconds, and reads must keep working while "
                    "the write path is down",
    "cost_cut": "the infrastructure bill must fall by 40% within a year without missing the latency targets, and "
                "old data may move to cheaper storage",
}
DESIGN_ASKS: tuple[str, ...] = (
    "Describe the main components, the data model, the key API endpoints, how it scales, how it handles failures, "
    "and the trade-offs you made.",
    "Answer in sections: estimates, components, data model, API, scaling, failure handling, and trade-offs "
    "against the alternatives you rejected.",
    "Sketch the architecture and how a request flows through it, the core tables or collections, three important "
    "API calls, what breaks first as load grows and how you would fix it, and what you would leave out of a "
    "first version.",
)
DESIGN_TEMPLATES: tuple[str, ...] = (
    "Design {a}. It must serve {b}. Requirements: {c}. {ask}",
    "We need {a}. Scale: {b}. Hard requirements: {c}. {ask}",
    "How would you build {a}, serving {b}, given that {c}? {ask}",
)


# --- the source -------------------------------------------------------------------------------

CATEGORIES = ("debugging", "reasoning", "math", "writing", "coding", "system_design")


def _id(category: str, *parts: str) -> str:
    return "/".join((NAME, category, *parts))


def debugging_text(incident: str, context: str, ask: str) -> str:
    template = pick_by_id(_id("debugging", incident, context, ask), DEBUG_TEMPLATES)
    return template.format(a=INCIDENTS[incident], b=DEBUG_CONTEXTS[context], c=DEBUG_ASKS[ask])


def reasoning_text(scenario: str, change: str, ask: str) -> str:
    text, changes = SCENARIOS[scenario]
    return f"{_one_line(text)}\n\n{REASONING_ASKS[ask].format(change=changes[change])}"


def math_text(template: str, case: tuple[Value, ...], ask: str) -> str:
    """The prompt for one case of a ``MATH`` template (refused where the case is not well posed) and an ask."""
    t = MATH[template]
    check_math_case(NAME, template, t, case)
    fills = {f: _money(v) if "${" + f + "}" in t.text else format_value(v) for f, v in zip(t.fields, case)}
    return f"{t.text.format(**fills)}\n\n{MATH_ASKS[ask]}"


def _money(value: Value) -> str:
    """A dollar amount: cents shown where there are any ("6.50", "1,200"), as a price is written."""
    return format_value(value) if isinstance(value, int) or float(value).is_integer() else f"{value:,.2f}"


def _math_key(template: str, case: tuple[Value, ...]) -> str:
    """A case's id part: its values, or for a data set (a text field) its label only."""
    return case_key(case[:1]) if template == "latency_sample" else case_key(case)


def writing_text(document: str, style: str, extra: str) -> str:
    template = pick_by_id(_id("writing", document, style, extra), WRITING_TEMPLATES)
    return template.format(a=_one_line(DOCUMENTS[document]), b=STYLE_RULES[style], c=WRITING_EXTRAS[extra])


def coding_text(spec: str, language: str, ask: str) -> str:
    template = pick_by_id(_id("coding", spec, language, ask), CODING_TEMPLATES)
    return template.format(a=_one_line(SPECS[spec]), b=CODE_LANGUAGES[language], c=CODING_ASKS[ask])


def system_design_text(system: str, scale: str, requirement: str) -> str:
    prompt_id = _id("system_design", system, scale, requirement)
    return pick_by_id(prompt_id, DESIGN_TEMPLATES).format(
        a=SYSTEMS[system], b=DESIGN_SCALES[scale], c=DESIGN_REQUIREMENTS[requirement],
        ask=pick_by_id(f"{prompt_id}#ask", DESIGN_ASKS))


def category_items(category: str) -> list[tuple[str, str]]:
    """(id below ``scenario_requests/<category>/``, prompt text) for every prompt of one category."""
    if category == "math":
        return [(f"{name}/{_math_key(name, case)}/{ask}", math_text(name, case, ask))
                for name, t in MATH.items() for case in t.cases for ask in MATH_ASKS]
    if category == "reasoning":
        return [(f"{name}/{change}/{ask}", reasoning_text(name, change, ask))
                for name, (_, changes) in SCENARIOS.items() for change in changes for ask in REASONING_ASKS]
    axes = {"debugging": (debugging_text, INCIDENTS, DEBUG_CONTEXTS, DEBUG_ASKS),
            "writing": (writing_text, DOCUMENTS, STYLE_RULES, WRITING_EXTRAS),
            "coding": (coding_text, SPECS, CODE_LANGUAGES, CODING_ASKS),
            "system_design": (system_design_text, SYSTEMS, DESIGN_SCALES, DESIGN_REQUIREMENTS)}
    if category not in axes:
        raise WorkloadError(f"{NAME}: unknown category {category!r}; allowed: {list(CATEGORIES)}")
    build, *lists = axes[category]
    return [("/".join(keys), build(*keys)) for keys in product(*lists)]


class ScenarioRequestsWorkload(Workload):
    """Every scenario x variant x ask-set combination of the six categories as a single-turn request."""

    NAME = NAME

    def load_pool(self) -> list[Prompt]:
        refuse_path(NAME, self.spec.path, "'custom' with path= for a prompt file")
        return [user_turn_prompt(_id(category, key), text, f"{NAME}:{category}")
                for category in CATEGORIES for key, text in category_items(category)]


__all__ = ["CATEGORIES", "DEBUG_ASKS", "DEBUG_CONTEXTS", "DESIGN_REQUIREMENTS", "DESIGN_SCALES", "DOCUMENTS",
           "INCIDENTS", "MATH", "MATH_ASKS", "REASONING_ASKS", "SCENARIOS", "SPECS", "SYSTEMS",
           "ScenarioRequestsWorkload", "category_items", "coding_text", "debugging_text", "math_text",
           "reasoning_text", "system_design_text", "writing_text"]
