"""An OpenAI-compatible HTTP server over one engine (``python -m runners.serve``).

    app = create_app(engine, ServerConfig(served_model_name="smollm2"))   # dspark.serving.app: engine in a thread
    app = create_app(EngineProcess(factory), config)                      # or in a process of its own
    serve(app, config, bind_socket(config))                               # dspark.serving.server

Modules: ``config`` (ServerConfig), ``protocol`` (request/response bodies, API errors), ``prompts``
(a request -> token ids and SamplingParams), ``text_stream`` (stop-safe streamed text),
``engine_loop`` (the engine loop, in a thread of this process), ``engine_process`` (the same loop in a
process of its own: runners.serve's default), ``metrics`` (Prometheus), ``app`` (routes),
``server`` (uvicorn with a draining shutdown), ``api_servers`` (several HTTP processes over one engine process:
runners.serve's ``api_servers``). Importing this package imports none of them.
"""
