import { NodeRuntime } from "@effect/platform-node"
import { Layer } from "effect"
import { AppConfig } from "./AppConfig.js"
import { ServerLive } from "./Http/Server.js"
import { holdRepeatedSignals } from "./Http/Shutdown.js"

holdRepeatedSignals()
ServerLive.pipe(Layer.provide(AppConfig.layer), Layer.launch, NodeRuntime.runMain)
