//! Links the addon as Node loads it (napi-build sets the platform's linker flags).

fn main() {
    napi_build::setup();
}
