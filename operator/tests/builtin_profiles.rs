//! The built-in profiles the planner core embeds are exactly the ones the API's schema offers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

#[test]
fn builtin_names_match_the_api() {
    let names: Vec<&str> = planner_core::profile::builtin_names().collect();
    assert_eq!(names, planner_api::BUILTIN_PROFILES);
}
