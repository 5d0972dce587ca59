use keyturn_tests::*;

#[tokio::test]
async fn test_fixture_connects_and_has_identity() {
    let w = World::new("approver").await;
    let t: Option<String> = w.agent.query_one("SELECT keyturn.current_tenant()", &[]).await.unwrap().get(0);
    assert_eq!(t.as_deref(), Some(w.tenant.as_str()));
}
